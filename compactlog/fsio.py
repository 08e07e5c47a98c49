"""The I/O seam: every call that changes files goes through one small object.

Tests wrap :class:`FileSystem` to fail the Nth write, drop an fsync or stop between the steps
of a crash protocol (LevelDB's ``Env``). Real ``kill -9`` tests come on top, not instead.
"""

from __future__ import annotations

import errno
import os


class FileSystem:
    """Thin wrappers over ``os``; subclass and override to inject faults."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def write(self, fd: int, data: bytes | memoryview) -> None:
        """Write all of ``data`` at the descriptor's position (short writes retried)."""
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(errno.EIO, "write returned no progress")
            view = view[written:]

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, position)
            if written <= 0:
                raise OSError(errno.EIO, "pwrite returned no progress")
            view = view[written:]
            position += written

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def remove(self, path: str) -> None:
        os.remove(path)

    def fsync_dir(self, directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def free_bytes(self, directory: str) -> int:
        stats = os.statvfs(directory)
        return stats.f_bavail * stats.f_frsize

    def write_atomic(self, directory: str, name: str, data: bytes) -> None:
        """Replace ``directory/name`` with ``data`` crash-safely.

        1. write ``name.tmp`` and fsync it: a crash leaves a stray ``.tmp`` (removed on open)
           and the old file untouched;
        2. rename over ``name``: atomic, readers see old or new, never a mix;
        3. fsync the directory: the rename survives a power loss.
        """
        target = os.path.join(directory, name)
        temp = target + ".tmp"
        fd = self.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.write(fd, data)
            self.fsync(fd)
        finally:
            self.close(fd)
        self.rename(temp, target)
        self.fsync_dir(directory)


DEFAULT_FS = FileSystem()
