"""PySpark finds this module by its name and registers ``DefaultSource`` as ``compactlog``.

PySpark (4.0+) lists the modules on a Python worker's ``sys.path`` with
``pkgutil.iter_modules()``, imports every one named ``pyspark_*`` and registers the
``DefaultSource`` each defines, so ``spark.read.format("compactlog")`` works without calling
:func:`compactlog.spark.register`. That listing sees only real files, so this module is a
real file in site-packages in an editable install too (``setup.py``,
``BuildPyWithSparkEntry``). Importing it has no side effects beyond importing the data
source classes.
"""

from compactlog.spark.source import CompactLogDataSource as DefaultSource

__all__ = ["DefaultSource"]
