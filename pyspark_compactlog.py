"""PySpark finds this module by its name and registers ``DefaultSource`` as ``compactlog``.

PySpark (4.0+) imports every top-level module named ``pyspark_*`` on its workers' path and
registers the ``DefaultSource`` each defines, so ``spark.read.format("compactlog")`` works
without calling :func:`compactlog.spark.register`. Importing this module has no side
effects beyond importing the data source classes.
"""

from compactlog.spark.source import CompactLogDataSource as DefaultSource

__all__ = ["DefaultSource"]
