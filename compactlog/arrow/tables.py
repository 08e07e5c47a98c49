"""A log's records as ``pyarrow.Table`` objects, and Arrow data appended to a log.

What :meth:`Log.append_arrow <compactlog.log.Log.append_arrow>`,
:meth:`~compactlog.log.Log.read_arrow` and :meth:`~compactlog.log.Log.latest_arrow` run.
Both directions are columnar end to end: appending encodes Arrow's buffers with
:mod:`~compactlog.arrow.encode` (the Spark writer's encoder), reading wraps the decoded
batches' columns as Arrow arrays with :mod:`~compactlog.arrow.convert` (the Spark
source's conversion). No Python object is made per record, except for headers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pyarrow as pa

from ..encoding.batch_decode import RecordBatch
from ..errors import InvalidRecordError
from .convert import RECORD_SCHEMA, Layout, chunk_columns, to_arrow
from .encode import APPEND_RECORDS, check_write_schema, config_encoding, encode_rows, normalize

if TYPE_CHECKING:
    from ..engine.logview import LogView


def append_arrow(log: LogView, data: pa.RecordBatch | pa.Table) -> range:
    """Append the rows of ``data`` in order, all or nothing; returns their offsets."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    elif not isinstance(data, pa.Table):
        raise InvalidRecordError(
            f"append_arrow takes a pyarrow.Table or pyarrow.RecordBatch, not "
            f"{type(data).__name__} (pandas: pyarrow.Table.from_pandas(df); polars: "
            "df.to_arrow())"
        )
    check_write_schema(data.schema)
    table = normalize(data)
    encoding = config_encoding(log.config)
    now = log.clock()
    batches = []
    for start in range(0, table.num_rows, APPEND_RECORDS):
        rows = table.slice(start, APPEND_RECORDS)
        batches.extend(encode_rows(rows, encoding, log.directory, now))
    return log.append_encoded(batches)


def arrow_table(batches: Iterable[RecordBatch]) -> pa.Table:
    """``batches`` as one table of :data:`~compactlog.arrow.convert.RECORD_SCHEMA`."""
    layout = Layout(RECORD_SCHEMA, "binary")
    chunks = [to_arrow(columns, None, layout) for columns in chunk_columns(batches)]
    return pa.Table.from_batches(chunks, schema=RECORD_SCHEMA)


__all__ = ["append_arrow", "arrow_table"]
