"""A log's records as ``pyarrow.Table`` objects, and Arrow data appended to a log.

What :meth:`Log.append_arrow <compactlog.log.Log.append_arrow>`,
:meth:`~compactlog.log.Log.read_arrow` and :meth:`~compactlog.log.Log.latest_arrow` run.
Both directions are columnar end to end: appending encodes Arrow's buffers with
:mod:`~compactlog.arrow.encode` (the Spark writer's encoder), reading wraps the decoded
batches' columns as Arrow arrays with :mod:`~compactlog.arrow.convert` (the Spark
source's conversion). No Python object is made per record, except for headers.

Formats. Reads give the log's declared ``key_format``/``value_format`` their Arrow type
(:func:`record_schema`): ``bytes`` is ``binary``, ``str`` is ``string``, ``json`` is
``string`` (the JSON text) or, given a ``struct`` ``value_type``, each value parsed into
it. Appends refuse, naming the row, a key or value its declared format could not decode
(:func:`check_declared`): what a reader would otherwise stop at later.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..batch_decode import RecordBatch
from ..config import LogConfig
from ..errors import InvalidRecordError
from .convert import RECORD_SCHEMA, Layout, chunk_columns, to_arrow
from .encode import APPEND_RECORDS, check_write_schema, config_encoding, encode_rows, normalize

if TYPE_CHECKING:
    from ..logview import LogView


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
    check_declared(table, log.config, log.directory)
    encoding = config_encoding(log.config)
    now = log.clock()
    batches = []
    for start in range(0, table.num_rows, APPEND_RECORDS):
        rows = table.slice(start, APPEND_RECORDS)
        batches.extend(encode_rows(rows, encoding, log.directory, now))
    return log.append_encoded(batches)


def check_declared(table: pa.Table, config: LogConfig, path: str) -> None:
    """Refuse (:class:`InvalidRecordError` naming the row) a key or value of a normalized
    ``table`` that the log's declared format would not decode: not UTF-8 for ``str``, not
    one JSON document for ``json``."""
    for what, declared in (("key", config.key_format), ("value", config.value_format)):
        if declared == "bytes":
            continue
        column = table.column(what)
        try:
            column.cast(pa.string())  # (checks UTF-8 in C)
            if declared == "str":
                continue
            items: Any = column.to_pylist()
            if None in items:
                [json.loads(item) for item in items if item is not None]
            else:
                list(map(json.loads, items))
            continue
        except (pa.ArrowInvalid, ValueError):
            pass
        row, error = _first_refused(column.to_pylist(), declared)
        raise InvalidRecordError(
            f"row {row}: the {what} {column[row].as_py()!r:.80} is not {declared} "
            f"({error}), and the log declares {what}_format={declared!r}; serialize it "
            f"first (or declare {what}_format='bytes')",
            path=path,
        )


def _first_refused(items: list[Any], declared: str) -> tuple[int, str]:
    for row, item in enumerate(items):
        if item is None:
            continue
        try:
            text = item.decode("utf-8")
            if declared == "json":
                json.loads(text)
        except ValueError as error:
            return row, f"{type(error).__name__}: {error}"
    raise AssertionError("a column that failed to decode has no row that fails")


def record_schema(
    key_format: str = "bytes", value_format: str = "bytes", value_type: Any = None
) -> pa.Schema:
    """:data:`~compactlog.arrow.convert.RECORD_SCHEMA` with the key and value columns of
    the declared formats: ``binary`` for bytes, ``string`` for str and json, or
    ``value_type`` (a ``struct``, the JSON values parsed) for a json value."""
    types = {"bytes": pa.binary(), "str": pa.string(), "json": pa.string()}
    value = types[value_format]
    if value_type is not None:
        if value_format != "json" or not pa.types.is_struct(value_type):
            raise InvalidRecordError(
                f"value_type is a pyarrow struct type for a log of JSON values "
                f"(value_format='json'), not {value_type} on value_format={value_format!r}"
            )
        value = value_type
    schema = RECORD_SCHEMA.set(0, pa.field("key", types[key_format]))
    return schema.set(1, pa.field("value", value))


def arrow_table(
    batches: Iterable[RecordBatch],
    key_format: str = "bytes",
    value_format: str = "bytes",
    value_type: Any = None,
) -> pa.Table:
    """``batches`` as one table of :func:`record_schema` (``RECORD_SCHEMA`` for bytes)."""
    schema = record_schema(key_format, value_format, value_type)
    layout = Layout(schema, "json_struct" if value_type is not None else "binary")
    chunks = [to_arrow(columns, None, layout) for columns in chunk_columns(batches)]
    return pa.Table.from_batches(chunks, schema=schema)


__all__ = ["append_arrow", "arrow_table", "check_declared", "record_schema"]
