"""Serializers: the Python objects a log's users append and read, and the bytes it stores.

The Kafka clients' convention: a ``key_serializer``/``value_serializer`` turns an object
into bytes on append, a ``key_deserializer``/``value_deserializer`` turns bytes back on
read. Three formats are built in, by name: ``"bytes"`` (no conversion), ``"str"`` (UTF-8)
and ``"json"`` (UTF-8 JSON, compact separators); any other format is a pair of callables
(msgpack, protobuf).

JSON is decoded by msgspec's C decoder (about 7x faster than ``json.loads``, whose Python
wrapper was most of a JSON follower's time) with ``json.loads``' exact results: a document
msgspec refuses is handed to ``json.loads``, which accepts what msgspec does not
(``NaN``, ``Infinity``, numbers beyond a float such as ``1e400``, lone surrogate escapes, a
byte order mark, UTF-16 and UTF-32) and raises its own error for what it refuses too. Where
both accept a document they agree (integers of any size stay exact ints; orjson was not
taken because it turns integers beyond 64 bits into floats without an error).

A log may *declare* its formats in its stored config (``key_format``/``value_format``,
:mod:`compactlog.config`); every reader honours them unless told otherwise. Callables
passed to ``open()`` override the declared format for that open only, and nothing about
them is stored. ``None`` (a missing key, a tombstone's value) is never converted.

The storage layer never sees a format: batches and columns (``read_batches``, compaction,
Spark's Arrow path) stay bytes; only :class:`~compactlog.encoding.batch_decode.Record` objects carry
decoded keys and values. A stored key or value that its deserializer refuses raises
:class:`~compactlog.errors.DecodeError` naming the log, the offset and the format.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import msgspec

from ..config import SERDE_FORMATS as FORMATS
from ..config import LogConfig
from ..errors import ConfigError, DecodeError, InvalidRecordError, UnsafeChangeError
from .batch_decode import Record, RecordBatch

Serializer = Callable[[Any], bytes]
Deserializer = Callable[[bytes], Any]


_JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _json_serializer(obj: Any) -> bytes:
    return _JSON_ENCODER.encode(obj).encode("utf-8")


_FAST_JSON = msgspec.json.decode
_FAST_JSON_REFUSES = (msgspec.MsgspecError, UnicodeDecodeError)


def json_loads(data: bytes) -> Any:
    """``json.loads(data)``'s result and errors, decoded by msgspec (module docstring)."""
    try:
        return _FAST_JSON(data)
    except _FAST_JSON_REFUSES:
        return json.loads(data)


_BUILT_IN: dict[str, tuple[Serializer | None, Deserializer | None]] = {
    "bytes": (None, None),  # None: no conversion at all (the fast paths stay as they are)
    # (C functions where they exist: no Python frame per key or value)
    "str": (str.encode, bytes.decode),  # (UTF-8 is their default)
    "json": (_json_serializer, json_loads),
}
assert tuple(_BUILT_IN) == FORMATS


def check_format(setting: str, name: object) -> str:
    """``name`` if it is a built-in format's name, else :class:`ConfigError` naming
    ``setting`` (the config or argument that carried it)."""
    if name not in _BUILT_IN:
        raise ConfigError(
            f"{setting} must be one of {', '.join(map(repr, FORMATS))}, not {name!r} "
            "(for another format pass a serializer and deserializer to open())"
        )
    return str(name)


@dataclass(frozen=True, slots=True)
class Side:
    """How one side of a record (key or value) converts: both callables ``None`` for bytes.

    ``label`` names the format in errors (a built-in name, or ``"custom"``)."""

    label: str
    serialize: Serializer | None
    deserialize: Deserializer | None


def side(
    what: str,
    declared: str,
    serializer: Serializer | str | None,
    deserializer: Deserializer | str | None,
) -> Side:
    """The conversion of ``what`` (``"key"`` or ``"value"``): the format ``declared`` in
    the config, with a serializer or deserializer given at open (a callable, or a built-in
    format's name) taking its place on its own direction."""
    name = check_format(f"{what}_format", declared)
    serialize, deserialize = _BUILT_IN[name]
    label = name
    if serializer is not None:
        serialize, label = _one(f"{what}_serializer", serializer, 0), _label(serializer)
    if deserializer is not None:
        deserialize, label = _one(f"{what}_deserializer", deserializer, 1), _label(deserializer)
    return Side(label, serialize, deserialize)


def _one(argument: str, given: Any, direction: int) -> Any:
    if isinstance(given, str):
        return _BUILT_IN[check_format(argument, given)][direction]
    if not callable(given):
        raise ConfigError(f"{argument} must be callable or a format name, not {given!r}")
    return given


def _label(given: Any) -> str:
    return given if isinstance(given, str) else "custom"


@dataclass(frozen=True, slots=True)
class Serde:
    """The key and value conversions of one open log (or one reader of it)."""

    key: Side
    value: Side
    path: str = ""

    @property
    def serializes(self) -> bool:
        return self.key.serialize is not None or self.value.serialize is not None

    @property
    def deserializes(self) -> bool:
        return self.key.deserialize is not None or self.value.deserialize is not None

    # -- writing ---------------------------------------------------------------------
    def dump_key(self, key: Any) -> Any:
        convert = self.key.serialize
        if convert is None or key is None:
            return key
        return _dump(convert, key, "key", self.key.label, self.path)

    def dump_value(self, value: Any) -> Any:
        convert = self.value.serialize
        if convert is None or value is None:
            return value
        return _dump(convert, value, "value", self.value.label, self.path)

    def dump_pairs(self, pairs: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """``(key, value)`` pairs as bytes (an item that is not a pair passes through for
        ``append_batch`` to refuse)."""
        dump_key, dump_value = self.dump_key, self.dump_value
        out: list[tuple[Any, Any]] = []
        for pair in pairs:
            try:
                key, value = pair
            except (TypeError, ValueError):
                out.append(pair)
                continue
            out.append((dump_key(key), dump_value(value)))
        return out

    # -- reading ---------------------------------------------------------------------
    def records(self, batch: RecordBatch) -> Iterator[Record]:
        """The records of ``batch`` with keys and values converted: each callable is
        mapped over the batch's whole key or value column (no Python frame of ours per
        record)."""
        if not self.deserializes:
            return batch.records()
        keys = self._load(self.key, "key", batch.keys(), batch.offsets)
        values = self._load(self.value, "value", batch.values(), batch.offsets)
        return batch.records(keys, values)

    def convert(self, records: Sequence[Record]) -> Iterator[Record]:
        """``records`` (as stored) with keys and values converted (for records already
        made, as the CLI's salvaging reader makes them)."""
        if not records:
            return iter(())
        offsets, keys, values, timestamps, headers = zip(*records, strict=True)
        keys = self._load(self.key, "key", keys, offsets)
        values = self._load(self.value, "value", values, offsets)
        columns = zip(offsets, keys, values, timestamps, headers, strict=True)
        return map(tuple.__new__, repeat(Record), columns)

    def _load(
        self, part: Side, what: str, items: Sequence[Any], offsets: Sequence[int]
    ) -> Sequence[Any]:
        return decode_column(part.deserialize, items, offsets, what, part.label, self.path)


def decode_column(
    convert: Deserializer | None,
    items: Sequence[Any],
    offsets: Sequence[int],
    what: str,
    label: str,
    path: str = "",
) -> Sequence[Any]:
    """``items`` (a batch's keys or values, ``None`` kept) decoded by ``convert``, mapped
    over the whole column; the first that it refuses raises :class:`DecodeError` naming
    ``path``, its offset and the format ``label``."""
    if convert is None:
        return items
    try:
        if None in items:  # (a scan in C; keys and values are rarely None)
            return [None if item is None else convert(item) for item in items]
        return map_decode(convert, items)
    except Exception:  # find which one, to name its offset (the error path only)
        for offset, item in zip(offsets, items, strict=True):
            if item is None:
                continue
            try:
                convert(item)
            except Exception as error:
                raise decode_error(what, int(offset), label, path, error) from error
        raise


def map_decode(convert: Deserializer, items: Sequence[Any]) -> list[Any]:
    """``list(map(convert, items))`` (no ``None`` among ``items``). The built-in json's
    column is mapped through msgspec's decoder alone, with no Python frame per value, unless
    a value needs ``json.loads``' rules (then :func:`json_loads` decodes the column)."""
    if convert is json_loads:
        try:
            return list(map(_FAST_JSON, items))
        except _FAST_JSON_REFUSES:
            pass
    return list(map(convert, items))


def decodes(convert: Deserializer, items: Sequence[Any]) -> bool:
    """Whether ``convert`` takes every item of ``items`` (``None`` skipped), without keeping
    what it makes: the door's and the disk table's check."""
    if None in items:
        items = [item for item in items if item is not None]
    try:
        map_decode(convert, items)
    except Exception:
        return False
    return True


def decode_error(what: str, offset: int, label: str, path: str, error: Exception) -> DecodeError:
    """The :class:`DecodeError` of the ``what`` (key or value) at ``offset``."""
    return DecodeError(
        f"{what} at offset {offset} is not valid {label} "
        f"({type(error).__name__}: {error}); read it with raw=True",
        path=path or None,
        offset=offset,
        part=what,
        format=label,
    )


def undecodable(
    batch: RecordBatch,
    key: Side,
    value: Side,
    path: str = "",
) -> list[tuple[int, DecodeError]]:
    """``(row, error)`` of every record of ``batch`` whose key or value its side cannot
    decode (a keyless record's key is not decoded); empty when all decode. One mapped pass
    per column; a record at a time only in a column that fails."""
    bad: dict[int, DecodeError] = {}
    offsets: list[int] = []
    for what, part, items in (("key", key, batch.keys()), ("value", value, batch.values())):
        convert = part.deserialize
        if convert is None or decodes(convert, items):
            continue
        offsets = offsets or batch.offsets.tolist()
        for row, item in enumerate(items):
            if item is None or row in bad:
                continue
            try:
                convert(item)
            except Exception as error:
                bad[row] = decode_error(what, offsets[row], part.label, path, error)
    return sorted(bad.items())


def _dump(convert: Serializer, obj: Any, what: str, label: str, path: str) -> bytes:
    try:
        data = convert(obj)
    except Exception as error:
        raise InvalidRecordError(
            f"{what} {obj!r:.80} cannot be serialized as {label} ({type(error).__name__}: {error})",
            path=path or None,
        ) from error
    if type(data) is not bytes:
        if isinstance(data, bytearray | memoryview):
            return bytes(data)
        raise InvalidRecordError(
            f"the {what} serializer returned {type(data).__name__}, not bytes", path=path or None
        )
    return data


RAW = Serde(Side("bytes", None, None), Side("bytes", None, None))


def serde_for(
    path: str,
    key_format: str = "bytes",
    value_format: str = "bytes",
    *,
    key_serializer: Serializer | str | None = None,
    value_serializer: Serializer | str | None = None,
    key_deserializer: Deserializer | str | None = None,
    value_deserializer: Deserializer | str | None = None,
) -> Serde:
    """The conversions of a log at ``path`` that declares ``key_format``/``value_format``,
    with anything given at open taking precedence. :data:`RAW` when nothing converts."""
    serde = Serde(
        side("key", key_format, key_serializer, key_deserializer),
        side("value", value_format, value_serializer, value_deserializer),
        path,
    )
    return serde if serde.serializes or serde.deserializes else RAW


def serializers_of(name: str) -> tuple[Serializer | None, Deserializer | None]:
    """``(serializer, deserializer)`` of a built-in format (``None``: bytes, no conversion)."""
    return _BUILT_IN[check_format("format", name)]


def deserializers(
    key_format: str = "bytes", value_format: str = "bytes"
) -> tuple[Deserializer | None, Deserializer | None]:
    """``(key_deserializer, value_deserializer)`` of the named formats (``None``: bytes, no
    conversion): what a reader that takes plain callables (``Table``) is given for a log's
    declared formats, e.g. ``deserializers(**declared_formats(log.config))``."""
    key = _BUILT_IN[check_format("key_format", key_format)][1]
    value = _BUILT_IN[check_format("value_format", value_format)][1]
    return key, value


def declared_formats(config: Any) -> dict[str, str]:
    """``{"key_format": ..., "value_format": ...}`` of a :class:`~compactlog.LogConfig`."""
    return {"key_format": config.key_format, "value_format": config.value_format}


def check_stored(
    directory: str,
    read: Callable[[], Iterable[RecordBatch]],
    stored: LogConfig,
    wanted: LogConfig,
) -> None:
    """Refuse (:class:`UnsafeChangeError` naming the log and the offset) a change of
    ``key_format``/``value_format`` to a format that a record already in the log, from
    ``start`` on, does not decode in: every reader would stop at it. The one check of
    ``compactlog config set`` and ``open(..., update_config=True)``: it reads the whole log
    once (a tombstone's value and a keyless record's key are not decoded), and only when a
    format changes to one that decodes. ``read`` gives the log's batches from its start (the
    engine's reader: this layer is below it)."""
    sides = []
    for what in ("key", "value"):
        name = getattr(wanted, f"{what}_format")
        if name != getattr(stored, f"{what}_format") and _BUILT_IN[name][1] is not None:
            sides.append((what, name, _BUILT_IN[name][1]))
    if not sides:
        return
    for batch in read():
        for what, name, convert in sides:
            items = batch.keys() if what == "key" else batch.values()
            if decodes(convert, items):
                continue
            try:
                decode_column(convert, items, batch.offsets.tolist(), what, name, directory)
            except DecodeError as error:
                raise UnsafeChangeError(
                    f"refusing {what}_format={name!r}: the {what} at offset {error.offset} "
                    f"is not valid {name} ({error.__cause__}), and readers of the declared "
                    f"format would stop there; copy the log's records into a log that "
                    f"declares it, or keep {what}_format={getattr(stored, what + '_format')!r} "
                    f"and read with {what}_deserializer= (Table: on_decode_error='skip')",
                    path=directory,
                ) from error


def serializing_append(append: Callable[..., int], serde: Serde) -> Callable[..., int]:
    """An ``append(key, value, *, timestamp_ms=None, headers=None)`` that serializes the
    key and value with ``serde``, then calls ``append`` (the log's path for bytes)."""
    dump_key, dump_value = serde.dump_key, serde.dump_value

    def append_objects(
        key: Any, value: Any, *, timestamp_ms: int | None = None, headers: Any = None
    ) -> int:
        return append(dump_key(key), dump_value(value), timestamp_ms=timestamp_ms, headers=headers)

    return append_objects


__all__ = [
    "FORMATS",
    "RAW",
    "Serde",
    "Side",
    "check_format",
    "check_stored",
    "declared_formats",
    "decode_column",
    "decode_error",
    "decodes",
    "deserializers",
    "json_loads",
    "map_decode",
    "serde_for",
    "serializers_of",
    "serializing_append",
    "undecodable",
]
