"""Arrow in and out of a log: :mod:`.encode` (Arrow to record batches), :mod:`.convert`
(record batches to Arrow), :mod:`.tables` (what the ``Log`` methods run).

pyarrow is a dependency of the core library, imported only when these modules are: by
the ``*_arrow`` methods of a log, the Spark data source and the Arrow restore engine.
"""
