"""The writers' lock file ``.lock`` and the shared head state it carries.

Writers in any process take an exclusive ``flock`` on ``.lock`` around each append; its
first bytes hold the head (active segment, end offset, size, CRC), the writing mark, the
doorbell, the sync point and the boot id, each stored into a map of the file. Readers read
the head without a lock (the CRC tells a torn read). The layout and what each field
promises after a crash or a power loss: docs/format.md, section 10.

``.writers.lock`` says who may write at all: every writable open holds a shared ``flock``
on it, ``exclusive=True`` an exclusive one stamped with its pid (``lockfile.py``), so an
exclusive writer and any other refuse each other at open, never by blocking.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from typing import NamedTuple

from ..encoding.format import crc32c
from . import filenames, lockfile

HEAD = struct.Struct("<IIqqqI")
HEAD_MAGIC = 0x44484C43  # "CLHD"
FLAG_PRECOMMIT_PENDING = 1
assert HEAD.size == 36
WRITING_MARK = HEAD.size  # byte 36 of .lock: 1 while a writer is between data and head
PUBLISHED_SIZE = HEAD.size + 1  # what publishing a head writes: the head and a cleared mark
DOORBELL = PUBLISHED_SIZE  # byte 37 of .lock: 1 while a subscriber sleeps waiting for a head
SYNC_POINT = struct.Struct("<qqI4x")  # base, size, crc of the 16 bytes before it, spare
SYNC_POINT_AT = 40
SYNC_POINT_END = SYNC_POINT_AT + SYNC_POINT.size
BOOT_AT = 64  # the boot id of the machine whose writer last opened the log: 16 bytes
BOOT_END = BOOT_AT + 16
LOCK_FILE_SIZE = 96
assert SYNC_POINT_END == BOOT_AT and BOOT_END <= LOCK_FILE_SIZE


class Boot:
    """This machine's boot id (Linux's ``/proc/sys/kernel/random/boot_id``, read once), or
    ``None`` where there is none. A power loss is a reboot, so a head stored under another
    boot id is one that no live writer stands behind. Tests that simulate a power loss give
    the simulated reboot an id of its own by setting ``BOOT.id``."""

    def __init__(self) -> None:
        self._id: bytes | None = None
        self._read = False

    @property
    def id(self) -> bytes | None:
        if not self._read:
            self._read = True
            try:
                with open("/proc/sys/kernel/random/boot_id", "rb") as handle:
                    self._id = bytes.fromhex(handle.read().decode().strip().replace("-", ""))
            except (OSError, ValueError):
                self._id = None
        return self._id

    @id.setter
    def id(self, value: bytes | None) -> None:
        self._id, self._read = value, True


BOOT = Boot()
_HEAD_FIELDS = struct.Struct("<IIqqq")  # the head without its CRC
_HEAD_CRC_MARK = struct.Struct("<IB")  # the CRC and a cleared writing mark


class Head(NamedTuple):
    flags: int
    active_base: int
    end_offset: int
    active_size: int

    @property
    def precommit_pending(self) -> bool:
        return bool(self.flags & FLAG_PRECOMMIT_PENDING)


def encode_head(head: Head) -> bytes:
    packed = HEAD.pack(HEAD_MAGIC, *head, 0)
    return packed[:-4] + struct.pack("<I", crc32c(packed[:-4]))


def decode_head(data: bytes) -> Head | None:
    if len(data) < HEAD.size:
        return None
    magic, flags, base, end, size, crc = HEAD.unpack_from(data)
    if magic != HEAD_MAGIC or crc32c(data[: HEAD.size - 4]) != crc:
        return None
    return Head(flags, base, end, size)


class SyncPoint(NamedTuple):
    """What was durable when a writer last synced: segment ``base`` up to byte ``size``."""

    base: int
    size: int

    def durable_end(self, base: int) -> int | None:
        """Up to where segment ``base`` is known to be on disk: the whole file for an
        older segment (``None``), ``size`` for this one, nothing (0) for a newer one."""
        if base < self.base:
            return None
        return self.size if base == self.base else 0


def encode_sync_point(base: int, size: int) -> bytes:
    fields = struct.pack("<qq", base, size)
    return SYNC_POINT.pack(base, size, crc32c(fields))


def decode_sync_point(data: bytes) -> SyncPoint | None:
    """The sync point stored in ``.lock``'s bytes (``None``: never stored, or torn)."""
    if len(data) < SYNC_POINT_AT + SYNC_POINT.size:
        return None
    base, size, crc = SYNC_POINT.unpack_from(data, SYNC_POINT_AT)
    fields = data[SYNC_POINT_AT : SYNC_POINT_AT + 16]
    if crc != crc32c(fields):
        return None
    return SyncPoint(base, size)


def read_sync_point(directory: str) -> SyncPoint | None:
    """The sync point in ``directory``'s ``.lock`` (``None`` if missing or unreadable)."""
    try:
        with open(os.path.join(directory, filenames.WRITER_LOCK), "rb") as handle:
            return decode_sync_point(handle.read(LOCK_FILE_SIZE))
    except FileNotFoundError:
        return None


def read_head(fd: int) -> Head | None:
    for _ in range(3):  # a read racing a writer's store fails its CRC: retry
        head = decode_head(os.pread(fd, HEAD.size, 0))
        if head is not None:
            return head
    return None


def read_published_head(fd: int, *, any_boot: bool = False) -> Head | None:
    """The head as readers may trust it: ``None`` when missing or unreadable, and when it
    was stored under another boot (a power loss or a reboot since a writer last opened the
    log: the head on disk is then stale or ahead of the data, as ``.lock`` is never fsynced,
    and only the next writer's recovery finds the data's end; readers read to the end of
    the valid data instead, ``segment.SegmentReader``). ``any_boot``: the head whatever
    boot stored it (a hint, as recovery reads it)."""
    for _ in range(3):  # a read racing a writer's store fails its CRC: retry
        data = os.pread(fd, LOCK_FILE_SIZE, 0)
        head = decode_head(data)
        if head is not None:
            boot = BOOT.id
            if any_boot or boot is None:
                return head
            if len(data) < BOOT_END or data[BOOT_AT:BOOT_END] != boot:
                return None
            return head
    return None


def read_head_file(path: str, *, any_boot: bool = False) -> Head | None:
    """The head in the ``.lock`` file at ``path`` as readers may trust it
    (:func:`read_published_head`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return read_published_head(fd, any_boot=any_boot)
    finally:
        os.close(fd)


def read_log_head(directory: str, *, any_boot: bool = False) -> Head | None:
    """The head in ``directory``'s ``.lock`` (:func:`read_head_file`)."""
    return read_head_file(os.path.join(directory, filenames.WRITER_LOCK), any_boot=any_boot)


def lock_exclusive(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX)


def try_lock_exclusive(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def encode_published(flags: int, active_base: int, end_offset: int, active_size: int) -> bytes:
    """The bytes a writer publishes at position 0 of ``.lock``: the head, the mark cleared.
    (Fields as arguments, not a :class:`Head`: this runs once per append.)"""
    fields = _HEAD_FIELDS.pack(HEAD_MAGIC, flags, active_base, end_offset, active_size)
    return fields + _HEAD_CRC_MARK.pack(crc32c(fields), 0)


HEAD_CRC = struct.Struct("<I")
CRC_AT = HEAD.size - 4  # the head's CRC covers bytes [0, 32) and is stored at 32
END_SIZE = struct.Struct("<qq")  # end_offset and active_size, bytes [16, 32) of the head
END_SIZE_AT = 16
assert _HEAD_FIELDS.size == CRC_AT == END_SIZE_AT + END_SIZE.size


def publish_into(
    buffer: bytearray,
    fields: memoryview,
    flags: int,
    active_base: int,
    end_offset: int,
    active_size: int,
) -> None:
    """Pack the bytes :func:`encode_published` returns into ``buffer`` (at least
    :data:`PUBLISHED_SIZE` long, byte 36 left 0; ``fields`` is ``memoryview(buffer)[:32]``,
    made once), allocating nothing."""
    _HEAD_FIELDS.pack_into(buffer, 0, HEAD_MAGIC, flags, active_base, end_offset, active_size)
    HEAD_CRC.pack_into(buffer, CRC_AT, crc32c(fields))


def publish_end_into(
    buffer: bytearray, fields: memoryview, end_offset: int, active_size: int
) -> None:
    """:func:`publish_into` for a ``buffer`` that already holds a whole head (of the same
    flags and active segment): only the end offset, the size and the CRC are packed. The
    per-append form: an append moves only those two fields, and every roll, refresh or
    flag change publishes the whole head first (``SegmentWriter._publish_head``)."""
    END_SIZE.pack_into(buffer, END_SIZE_AT, end_offset, active_size)
    HEAD_CRC.pack_into(buffer, CRC_AT, crc32c(fields))


class SharedBytes:
    """A writable shared mapping of a file's first bytes that keeps no descriptor open.

    Python's ``mmap`` keeps a duplicate of the descriptor it maps, and a process holding
    ``.lock`` open for writing counts as a writer (``compactlog.cli`` lists those, and
    refuses ``repair`` while one is there); a subscriber is not one, so its doorbell map is
    made with ``mmap(2)`` through ``ctypes`` and the descriptor is closed at once."""

    def __init__(self, fd: int, size: int) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address is None or address == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "mmap failed")
        self._munmap = libc.munmap
        self._address: int | None = address
        self._size = size
        self._view = (ctypes.c_ubyte * size).from_address(address)

    def __getitem__(self, index: int) -> int:
        if self._address is None:
            raise ValueError("mapping closed")
        return self._view[index]

    def __setitem__(self, index: int, value: int) -> None:
        if self._address is None:
            raise ValueError("mapping closed")
        self._view[index] = value

    def close(self) -> None:
        if self._address is not None:
            address, self._address = self._address, None
            del self._view
            self._munmap(address, self._size)


def map_lock_file_if_present(path: str) -> SharedBytes | None:
    """A writable map of ``.lock`` for a subscriber's doorbell, or ``None`` when the file is
    missing, shorter than :data:`LOCK_FILE_SIZE` (no writer mapped it yet) or not writable
    by this process. Never creates or grows the file, and keeps no descriptor open."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < LOCK_FILE_SIZE:
            return None
        return SharedBytes(fd, LOCK_FILE_SIZE)
    except (OSError, AttributeError):
        return None
    finally:
        os.close(fd)


def map_lock_file(path: str) -> mmap.mmap:
    """Map the first :data:`LOCK_FILE_SIZE` bytes of ``.lock`` (grown to that size first:
    growing only appends zeros, so it is safe against a concurrent writer).

    The map gets its own open file description, so that the writer's ``flock`` descriptor
    stays the only thing holding the lock: closing it releases the lock, as before."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        if os.fstat(fd).st_size < LOCK_FILE_SIZE:
            os.ftruncate(fd, LOCK_FILE_SIZE)
        return mmap.mmap(fd, LOCK_FILE_SIZE)
    finally:
        os.close(fd)


def register_writer(directory: str, lock_path: str, *, exclusive: bool) -> int:
    """Take ``.writers.lock`` for a writable open (see the module docstring); returns the
    descriptor, whose closing releases it. Raises :class:`LogLockedError` at once when an
    exclusive writer holds the log, or, for ``exclusive``, when any other writer does."""
    from ..errors import LogLockedError

    try:
        return lockfile.lock(lock_path, shared=not exclusive, note="exclusive" if exclusive else "")
    except lockfile.LockHeld as held:
        holder = held.holder
        if exclusive:
            raise LogLockedError(
                "exclusive=True needs to be the only writer, but another process has this "
                f"log open for writing{f' ({holder})' if holder else ''}",
                path=directory,
            ) from None
        raise LogLockedError(
            "this log is open for writing with exclusive=True by another process "
            f"({holder or 'pid unknown'}); no other process can write, compact or repair it "
            "until that writer closes (it compacts in its own process: log.compact())",
            path=directory,
        ) from None


def release_writer(fd: int, *, exclusive: bool) -> None:
    lockfile.release(fd, clear=exclusive)  # (no stale pid for the next refusal to name)


def other_writers(lock_path: str) -> bool:
    """Whether some open holds ``.writers.lock`` (asked by one that has not registered yet:
    an exclusive ``flock`` it cannot take means another writable open exists). A moment's
    answer, as any such check is."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (releases the lock if it was taken)
    return False
