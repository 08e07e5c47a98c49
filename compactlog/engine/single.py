"""The record-at-a-time path: the function an open log installs as its ``append``.

One ``append`` per record is how JLog's users and most changelog producers write, so every
bytecode between the caller and the ``pwrite`` is paid once per record. A method that asks
on every call which of the writer's modes it is in, and then calls the encoder and the head
publisher as functions of their own, spends more time on that than on the record (see
docs/benchmarks.md, issue 12). So :func:`build_plain_append` builds, once per configuration,
one function for the mode the open log is in, with everything it uses bound to local names,
and ``Log._choose_append_path`` installs it as that log's ``append``.

The function writes a *plain* record in one frame: a bytes key and a bytes value of at most
:data:`PLAIN_MAX_BYTES` together (and ``max_record_bytes``), no ``timestamp_ms``, no headers.
Any other call goes to ``Log.append``, the general path, unchanged. A plain append:

1. takes the thread lock (a thread that finds it taken queues its record for a group write,
   ``FastPathHooks.append_queued``); a shared writer then takes the ``flock`` and compares
   the head in the map of ``.lock`` with what it last published, catching up if another
   process wrote (``FastPathHooks.prepare_append``); a steady ``exclusive=True`` writer
   skips that, as nobody else can write;
2. reads the wall clock and encodes the one-record batch with its offset
   (``batch_encode.encode_plain``, which ``encode_single`` uses for such a record);
3. only when the record crosses the active segment's checkpoint (``plain_stop`` bytes or
   ``plain_deadline`` ms, see ``ActiveSegment``), checks free space and rolls the segment
   (``FastPathHooks.checkpoint``), which per record would cost a clock read and
   three comparisons;
4. writes the record under the crash protocol of ``SegmentWriter.append_record``: a
   shared writer sets the writing mark and calls ``pwrite``; an exclusive one stores the
   record into the reserved, mapped room past the segment's data (``tailmap.py``: no system
   call) or, where the file system cannot reserve room, calls ``pwrite`` too; then maybe an
   index entry; the head's end offset, size and CRC stored into the map of ``.lock``
   (which clears the mark), the doorbell answered if a subscriber rang;
5. releases the locks, and fsyncs before returning under ``sync="always"``.
"""

from __future__ import annotations

from collections.abc import Callable
from fcntl import LOCK_EX, LOCK_UN, flock
from os import pwrite
from time import time_ns
from typing import TYPE_CHECKING

from ..encoding.batch_encode import PLAIN_MAX_BYTES, encode_plain
from ..encoding.format import crc32c
from ..storage.head import (
    CRC_AT,
    DOORBELL,
    END_SIZE,
    END_SIZE_AT,
    HEAD_CRC,
    PUBLISHED_SIZE,
    WRITING_MARK,
)

if TYPE_CHECKING:
    from .writer import SegmentWriter


AppendFunction = Callable[..., int]


def build_plain_append(
    writer: SegmentWriter, max_record_bytes: int, general: AppendFunction
) -> AppendFunction:
    """The ``append(key, value, *, timestamp_ms=None, headers=None)`` of a log whose writer
    is ``writer`` (no precommit or linger buffer, the plain file system, no compression, the
    wall clock: ``Log._choose_append_path`` checks). Calls that are not plain go to
    ``general``, the log's own ``Log.append``. Everything it uses of the writer comes
    through ``writer.fast_path_hooks()`` and the attributes ``FastPathHooks`` lists."""
    limit = min(max_record_bytes, PLAIN_MAX_BYTES)
    shared = not writer.sole_writer
    sync_always = writer.config.sync == "always"
    index_interval = writer.config.index_interval_bytes
    lock = writer.lock
    acquire, release = lock.acquire, lock.release
    hooks = writer.fast_path_hooks()
    queued = hooks.append_queued
    prepare = hooks.prepare_append
    catch_up = hooks.catch_up
    checkpoint = hooks.checkpoint
    refusal = hooks.refusal
    ring = hooks.ring_doorbell
    published = hooks.published
    published_fields = hooks.published_fields
    write_rest = writer.fs.pwrite  # (loops until every byte is written)
    lock_fd = writer.lock_fd
    head_map = writer.head_map
    pack_end_size = END_SIZE.pack_into
    pack_head_crc = HEAD_CRC.pack_into

    def append(
        key: bytes | None,
        value: bytes | None,
        *,
        timestamp_ms: int | None = None,
        headers: object = None,
    ) -> int:
        if (
            type(key) is not bytes
            or type(value) is not bytes
            or timestamp_ms is not None
            or headers is not None
            or len(key) + len(value) > limit
        ):
            return general(key, value, timestamp_ms=timestamp_ms, headers=headers)
        if not acquire(False):  # (positional: parsing a keyword costs a little)
            return queued([key, value, time_ns() // 1_000_000, b"", None])
        locked_here = False
        try:
            if shared:  # 1. (prepare_append, inlined for the common case)
                if writer.flock_held or writer.closed or writer.sync_failed is not None:
                    locked_here = prepare()  # (a closed log or a failed fsync raises)
                else:
                    flock(lock_fd, LOCK_EX)
                    writer.flock_held = locked_here = True
                    if head_map[0:PUBLISHED_SIZE] != published or writer.active is None:
                        catch_up()  # another process wrote (or died)
            elif not writer.steady:
                locked_here = prepare()
            timestamp = time_ns() // 1_000_000  # 2. (wall_clock_ms, inlined)
            offset = writer.end_offset
            data = encode_plain(key, value, timestamp, offset)
            size = len(data)
            active = writer.active
            position = active.size
            end = position + size
            if end > active.plain_stop or timestamp >= active.plain_deadline:
                active = checkpoint(size, timestamp)  # 3.
                position = active.size
                end = position + size
            window = active.window
            if window is not None:  # 4. an exclusive writer's mapped room (tailmap.py)
                start = window.start  # (the checkpoint keeps plain_stop within the window)
                window.map[position - start : end - start] = data
            else:
                if shared:  # (nobody could see an exclusive writer's mark)
                    head_map[WRITING_MARK] = 1
                try:
                    written = pwrite(active.fd, data, position)
                    if written != size:
                        write_rest(active.fd, data[written:], position + written)
                except OSError as error:
                    active.undo_partial_write(position)
                    raise refusal(error) from error
            active.size = end
            writer.end_offset = offset + 1
            if position - active.last_index_pos >= index_interval:
                active.add_index_entry(offset, position)
            pack_end_size(published, END_SIZE_AT, offset + 1, end)
            pack_head_crc(published, CRC_AT, crc32c(published_fields))
            head_map[0:PUBLISHED_SIZE] = published
            if head_map[DOORBELL]:
                ring()
            writer.write_seq = seq = writer.write_seq + 1
        except OSError as error:  # a roll, an index entry or a refresh failed to write
            raise refusal(error) from error
        finally:
            if locked_here:  # 5.
                writer.flock_held = False
                flock(lock_fd, LOCK_UN)
            release()
        if sync_always:
            writer.sync_through(seq)
        return offset

    return append
