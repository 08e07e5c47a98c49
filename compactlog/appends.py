"""The append API of an open :class:`~compactlog.log.Log`: records checked, stamped and
encoded, then handed to the writer (``engine/writer.py``) or to its buffers.

A part of ``Log`` (the mixin :class:`LogAppends`); a plain record with the default settings
takes the function ``engine/single.py`` builds instead of :meth:`LogAppends.append`.
docs/architecture.md follows an append from here to the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from time import time_ns
from typing import TYPE_CHECKING, Any

from .encoding.batch_encode import EncodedBatch, OneRecord, encode_batch, encode_within_segment
from .encoding.format import CODECS, encode_headers
from .errors import CompactLogError, InvalidRecordError, RecordTooLargeError

if TYPE_CHECKING:
    from .config import LogConfig
    from .encoding.serde import Serde
    from .engine.writer import SegmentWriter
    from .storage.state_files import Meta

_new_tuple = tuple.__new__


class LogAppends:
    """``append``, ``append_batch``, ``append_arrow``, ``append_encoded`` and ``flush``."""

    # what the append API uses of the log
    directory: str
    writer: SegmentWriter | None
    clock: Callable[[], int]
    serde: Serde
    _closed: bool
    _wall_clock: bool

    if TYPE_CHECKING:

        @property
        def meta(self) -> Meta: ...
        @property
        def config(self) -> LogConfig: ...
        @property
        def end_offset(self) -> int: ...
        def _writable(self) -> SegmentWriter: ...

    def append(
        self,
        key: bytes | None,
        value: bytes | None,
        *,
        timestamp_ms: int | None = None,
        headers: Mapping[str, bytes] | None = None,
    ) -> int:
        """Append one record; returns its offset. ``value=None`` appends a tombstone.

        With the default settings the record is visible to every reader when this returns
        and durable per the ``sync`` policy. With ``precommit_bytes`` it waits in the
        crash-safe precommit buffer, with ``linger_ms`` in memory (lost if the process is
        killed), until the next flush; see the user guide.
        """
        # The general path: a plain record usually never gets here, as the open log's own
        # ``append`` (``single.py``, installed by _choose_append_path) writes it.
        writer = self.writer
        if writer is None or self._closed:
            writer = self._writable()
        config = self.meta.config
        if type(key) is bytes and type(value) is bytes:
            if len(key) + len(value) > config.max_record_bytes:
                self._refuse_size(len(key) + len(value), config.max_record_bytes)
        else:
            _check_record(key, value, config.compacted, self.directory)
            size = (0 if key is None else len(key)) + (0 if value is None else len(value))
            if size > config.max_record_bytes:
                self._refuse_size(size, config.max_record_bytes)
        if timestamp_ms is not None:
            timestamp = _check_timestamp(timestamp_ms, self.directory)
        elif self._wall_clock:
            timestamp = time_ns() // 1_000_000  # wall_clock_ms, inlined
        else:
            timestamp = self.clock()
        if not headers and writer.plain_single and config.compression == "none":
            return writer.append_record(key, value, timestamp, b"")
        header_block = _encode_headers(headers, self.directory) if headers else b""
        if writer.linger is not None or writer.precommit is not None:
            # (made as ``batch_decode`` makes a ``Record``: a NamedTuple's own ``__new__`` is a
            # Python frame, a measurable part of a precommit append)
            record = _new_tuple(OneRecord, (key, value, timestamp, header_block))
            if writer.linger is not None:
                return writer.append_linger(record)
            if config.precommit_bytes > 0:
                offset = writer.append_precommit(record)
                if offset >= 0:
                    return offset
        if config.compression == "none":
            return writer.append_record(key, value, timestamp, header_block)
        return self._append_columns([key], [value], timestamp, [headers] if headers else None).start

    def _refuse_size(self, size: int, limit: int) -> None:
        raise RecordTooLargeError(
            f"record of {size} bytes exceeds max_record_bytes={limit}", path=self.directory
        )

    def append_batch(
        self,
        records: Iterable[tuple[bytes | None, bytes | None]],
        *,
        timestamp_ms: int | None = None,
        timestamps_ms: Sequence[int] | None = None,
        headers: Sequence[Mapping[str, bytes] | None] | None = None,
    ) -> range:
        """Append ``(key, value)`` pairs as one batch (or a few, if larger than about half a
        segment); returns the range of offsets assigned, consecutive and in order.

        ``timestamp_ms`` stamps every record alike; ``timestamps_ms`` and ``headers`` give one
        per record instead. Keys and values are serialized as :meth:`append` does.
        """
        self._writable()
        items = records if isinstance(records, list | tuple) else list(records)
        if self.serde.serializes:
            items = self.serde.dump_pairs(items)
        if not items:
            end = self.end_offset
            return range(end, end)
        try:
            # two comprehensions, not zip(*items): zip's per-record tuples wake the garbage
            # collector, which then walks the whole heap (measured: 300 us per 1,000 records)
            # (unpacking, unlike indexing, also refuses items that are not exactly pairs)
            keys = [key for key, _value in items]
            values = [value for _key, value in items]
        except (TypeError, ValueError):
            raise InvalidRecordError(
                "append_batch takes an iterable of (key, value) pairs", path=self.directory
            ) from None
        if timestamps_ms is not None:
            if len(timestamps_ms) != len(keys):
                raise InvalidRecordError(
                    "timestamps_ms must have one timestamp per record", path=self.directory
                )
            stamps: int | Sequence[int] = [
                _check_timestamp(t, self.directory) for t in timestamps_ms
            ]
        else:
            stamps = (
                self.clock()
                if timestamp_ms is None
                else _check_timestamp(timestamp_ms, self.directory)
            )
        if headers is not None and len(headers) != len(keys):
            raise InvalidRecordError(
                "headers must have one entry (or None) per record", path=self.directory
            )
        return self._append_columns(keys, values, stamps, headers)

    def _append_columns(
        self,
        keys: Sequence[Any],
        values: Sequence[Any],
        timestamps: int | Sequence[int],
        headers: Sequence[Mapping[str, bytes] | None] | None,
    ) -> range:
        self._writable()
        config = self.config
        codec = CODECS[config.compression]
        compacted = config.compacted

        def encode(lo: int, hi: int) -> EncodedBatch:
            whole = lo == 0 and hi == len(keys)
            return encode_batch(
                keys if whole else keys[lo:hi],
                values if whole else values[lo:hi],
                timestamps if isinstance(timestamps, int) or whole else timestamps[lo:hi],
                headers=headers if headers is None or whole else headers[lo:hi],
                codec=codec,
                level=config.compression_level,
                allow_none_keys=not compacted,
            )

        def sizes() -> list[int]:
            return [
                (len(k) if k is not None else 0) + (len(v) if v is not None else 0)
                for k, v in zip(keys, values, strict=True)
            ]

        try:
            batches = encode_within_segment(encode, len(keys), sizes, config.segment_bytes)
        except TypeError as error:
            if isinstance(error, InvalidRecordError) and error.path is None:  # from batch_encode
                raise InvalidRecordError(str(error), path=self.directory) from None
            if isinstance(error, CompactLogError):
                raise
            raise InvalidRecordError(f"bad header: {error}", path=self.directory) from None
        return self.append_encoded(batches)

    def append_arrow(self, data: Any) -> range:
        """Append the rows of a ``pyarrow.Table`` or ``RecordBatch``, in order, all or
        nothing; returns their offsets. Columns: ``key`` and ``value`` (binary or string; a
        null value is a tombstone), optional ``timestamp`` (a timestamp, or integer ms;
        null means now) and ``headers`` (``map<string, binary|string>``). Encoded straight
        from Arrow's buffers (``compactlog.arrow.encode``); other columns are refused."""
        from .arrow.tables import append_arrow

        return append_arrow(self, data)

    def check_encoded(self, batches: Sequence[EncodedBatch]) -> None:
        """Refuse batches this log's configuration does not allow: a record larger than
        ``max_record_bytes``, or a record with no key on a compacted log. Batches encoded
        by :meth:`append_batch` are checked while encoding; this is for batches encoded
        elsewhere (the Spark writer's tasks), checked again against the configuration
        the log has now, when they are appended."""
        config = self.config
        for batch in batches:
            if batch.largest_record > config.max_record_bytes:
                raise RecordTooLargeError(
                    f"a record of {batch.largest_record} bytes exceeds "
                    f"max_record_bytes={config.max_record_bytes}",
                    path=self.directory,
                )
            if batch.null_keys and config.compacted:
                raise InvalidRecordError(
                    "a record with no key (None) is not allowed on a compacted log "
                    f"(cleanup_policy={config.cleanup_policy!r}: every record needs a key)",
                    path=self.directory,
                )

    def append_encoded(self, batches: Sequence[EncodedBatch]) -> range:
        """Append batches already encoded (``batch_encode.encode_batch``/``encode_columns``)
        back to back, under one hold of the writers' lock; returns their offsets.

        Internal but public: the path of :meth:`append_batch` after encoding, and of
        writers that encode elsewhere and in parallel (the Spark writer's tasks), so
        appending is stamping each batch's base offset and writing its bytes. A batch
        takes ``last_delta + 1`` offsets (its record count, for every fresh batch); keep
        each within half a segment (``batch_encode.encode_within_segment``) so segments roll
        near ``segment_bytes``. :meth:`check_encoded` runs first: a refused batch writes
        nothing, nor does any other of the call.
        """
        writer = self._writable()
        self.check_encoded(batches)
        if not batches:
            end = self.end_offset
            return range(end, end)
        first, _seq = writer.append_encoded(batches)
        return range(first, first + sum(b.last_delta + 1 for b in batches))

    def flush(self) -> None:
        """Make every append so far visible to readers and durable (all sync policies)."""
        writer = self._writable()
        writer.materialize()
        writer.sync_all(record_point=True)

    async def flush_async(self) -> None:
        """:meth:`flush` from a coroutine: every append so far is durable (as with
        ``sync="always"``) when this returns. The ``fsync`` runs in the event loop's default
        executor, so the loop keeps serving other tasks meanwhile."""
        import asyncio

        self._writable()
        await asyncio.get_running_loop().run_in_executor(None, self.flush)


def _check_record(key: Any, value: Any, compacted: bool, path: str) -> None:
    """A single append's key and value, refused as the arguments they are (``key must be
    bytes``), with the log's path."""
    from .encoding.batch_encode import validate_column

    try:
        validate_column([key], "key", allow_none=not compacted, single=True)
        validate_column([value], "value", allow_none=True, single=True)
    except InvalidRecordError as error:
        raise InvalidRecordError(str(error), path=path) from None


def _encode_headers(headers: Any, path: str) -> bytes:
    if not isinstance(headers, Mapping):
        raise InvalidRecordError(
            f"headers must be a mapping of str to bytes, not {headers!r}", path=path
        )
    try:
        return encode_headers(headers)
    except TypeError as error:
        raise InvalidRecordError(f"bad header: {error}", path=path) from None


def _check_timestamp(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRecordError(
            f"timestamp_ms must be a non-negative int, not {value!r}", path=path
        )
    return value
