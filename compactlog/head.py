"""The writers' lock file ``.lock`` and the shared head state it carries.

Writers in any process take an exclusive ``flock`` on ``.lock`` around each append. The
first 36 bytes of the file describe the log's head as the last writer left it::

    magic u32 "CLHD" | flags u32 | active_base i64 | end_offset i64 | active_size i64 | crc u32

A writer that finds the head equal to its own cached view (and the active segment's size on
disk equal to ``active_size``) knows nobody else wrote and appends at once; otherwise it
re-reads the directory and validates the tail (see ``writer.SegmentWriter._refresh``).
Readers may read the head without any lock: the CRC tells a torn read, which they retry.
"""

from __future__ import annotations

import fcntl
import os
import struct
from typing import NamedTuple

from .format import crc32c

HEAD = struct.Struct("<IIqqqI")
HEAD_MAGIC = 0x44484C43  # "CLHD"
FLAG_PRECOMMIT_PENDING = 1
assert HEAD.size == 36


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


def read_head(fd: int) -> Head | None:
    for _ in range(3):  # a read racing a writer's pwrite fails its CRC: retry
        head = decode_head(os.pread(fd, HEAD.size, 0))
        if head is not None:
            return head
    return None


def read_head_file(path: str) -> Head | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return read_head(fd)
    finally:
        os.close(fd)


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
