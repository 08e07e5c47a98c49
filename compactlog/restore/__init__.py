"""Reading a log's latest state in bulk without Spark: planning a read (which snapshot,
which offsets, which partitions, which records: ``plan.py``, ``ranges.py``), the read
options and schemas (``options.py``, ``ddl.py``), and the Arrow restore engine
(``arrow_restore.py``, no JVM). The Spark source (``compactlog/spark/``) plans and reads
through these; nothing here imports pyspark (``tests/test_restore_arrow.py`` checks it).
"""
