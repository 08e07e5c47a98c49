"""The ``compactlog`` Python data source (``pyspark.sql.datasource``) for batch reads.

Spark pickles these classes by reference and imports this module in every Python worker,
so it must have no import-time side effects: it defines classes and nothing else (no
session, no environment changes, no file access). :class:`CompactLogDataSource` hands
out the batch reader defined here, the partitioned reader (``partitioned.py``), the stream
reader (``stream.py``) and the writer (``writer.py``, chosen in ``partitioned.make_writer``);
a task's offsets are :class:`~.input_partition.CompactLogPartition`.

Every entry point is decorated with :func:`~.user_errors.ours`, so a compactlog error
reaches the user as our message right after Spark's prefix, not a traceback.

Schema: ``key binary, value binary, offset bigint, timestamp timestamp,
headers map<string,binary>`` (plus ``deleted boolean`` in changelog mode). With
``valueFormat=string`` the value is a string; with ``valueFormat=json`` the ``value``
column is replaced by the fields of ``valueSchema`` (a DDL string) or, with
``.schema(...)``, every column the user names that is not a metadata column is read from
the JSON value. Options: ``docs/spark.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from ..restore.options import ReadOptions, parse_options, schema_ddl
from .input_partition import CompactLogPartition
from .user_errors import ours


class CompactLogReader(DataSourceReader):
    """Plans once (snapshot, range, head map, partitions) and reads partitions as Arrow."""

    @ours
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        from ..arrow.convert import Layout
        from ..restore.plan import plan_read
        from .arrow import target_schema

        self.options = options
        self.schema = schema
        Layout(target_schema(schema), options.value_format).check()  # before any snapshot
        self.plan = plan_read(options)

    def partitions(self) -> Sequence[InputPartition]:
        return [CompactLogPartition(p.index, p.start, p.end) for p in self.plan.partitions]

    @ours
    def read(self, partition: InputPartition) -> Iterator[Any]:
        from ..arrow.convert import Layout, to_arrow
        from ..restore.plan import Partition, read_partition
        from .arrow import target_schema

        assert isinstance(partition, CompactLogPartition)
        layout = Layout(target_schema(self.schema), self.options.value_format)
        part = Partition(partition.index, partition.start, partition.end)
        for columns, keep in read_partition(self.plan, part):
            yield to_arrow(columns, keep, layout)


class CompactLogDataSource(DataSource):
    """``spark.read.format("compactlog").load(path)``: a log or a snapshot as a table."""

    @classmethod
    def name(cls) -> str:
        return "compactlog"

    @ours
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = parse_options(options)

    @ours
    def schema(self) -> str:
        from ..storage.logdirs import PARTITION_COLUMN, is_partitioned

        if is_partitioned(self.parsed.path):  # a directory of logs: compactlog/spark/partitioned.py
            return f"{schema_ddl(self.parsed)}, {PARTITION_COLUMN} INT"
        return schema_ddl(self.parsed)

    @ours
    def reader(self, schema: StructType) -> DataSourceReader:
        from ..storage.logdirs import is_partitioned
        from .partitioned import PartitionedReader

        if is_partitioned(self.parsed.path):
            return PartitionedReader(self.parsed, schema)
        return CompactLogReader(self.parsed, schema)

    @ours
    def streamReader(self, schema: StructType) -> Any:
        """``spark.readStream.format("compactlog")``: see :mod:`compactlog.spark.stream`."""
        from .stream import make_stream_reader

        return make_stream_reader(self.options, self.parsed, schema)

    @ours
    def writer(self, schema: StructType, overwrite: bool) -> Any:
        """``df.write.format("compactlog")``: see :mod:`compactlog.spark.writer`."""
        from .partitioned import make_writer

        return make_writer(self.options, schema, overwrite)


__all__ = ["CompactLogDataSource", "CompactLogPartition", "CompactLogReader"]
