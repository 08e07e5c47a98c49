"""The head as this process's writer publishes it into the map of ``.lock`` (head.py).

A published head is a store into the shared map, no system call: readers of any process see
it at once (the same page cache) and a ``kill -9`` cannot undo it. The bytes are packed in
place into one buffer (:attr:`PublishedHead.bytes`; the append paths pack only the end
offset and size into it, ``head.publish_end_into``), which is also what this process
compares the map with to learn whether another process wrote since (:meth:`is_current`).
"""

from __future__ import annotations

import mmap

from .fsio import FileSystem
from .head import DOORBELL, HEAD, PUBLISHED_SIZE, publish_into


class PublishedHead:
    """The bytes ``[0, PUBLISHED_SIZE)`` of ``.lock`` as this process last stored them
    (meaningless until the writer has an active segment); the writer's lock guards it."""

    __slots__ = ("_fs", "_lock_fd", "bytes", "fields", "map")

    def __init__(self, fs: FileSystem, lock_fd: int, head_map: mmap.mmap) -> None:
        self._fs = fs
        self._lock_fd = lock_fd
        self.map = head_map
        self.bytes = bytearray(PUBLISHED_SIZE)
        self.fields = memoryview(self.bytes)[: HEAD.size - 4]  # what the head's CRC covers

    def publish(self, flags: int, active_base: int, end_offset: int, active_size: int) -> None:
        """Pack the whole head and store it (which clears the writing mark)."""
        publish_into(self.bytes, self.fields, flags, active_base, end_offset, active_size)
        self._store()

    def _store(self) -> None:
        """inotify does not see a store, so when a subscriber has rung for it (the doorbell,
        ``head.py``) the head is also written with one ``pwrite``, which wakes every
        subscriber sleeping on the file."""
        head_map = self.map
        head_map[0:PUBLISHED_SIZE] = self.bytes
        if head_map[DOORBELL]:
            self.ring()

    def ring(self) -> None:
        """Answer the doorbell: clear it, then ``pwrite`` the head just stored (the same
        bytes, so a reader racing it sees the head either way). A failure is ignored: the
        record is written and published, and a subscriber that misses the ring finds it on
        its safety re-check; failing the append would invite a duplicate by a retry."""
        self.map[DOORBELL] = 0
        try:
            self._fs.pwrite(self._lock_fd, self.bytes, 0)
        except OSError:
            pass

    def is_current(self) -> bool:
        """Whether the map holds what this process last published: no other process wrote
        (or died writing) since, and no writing mark is set."""
        return self.map[:PUBLISHED_SIZE] == self.bytes
