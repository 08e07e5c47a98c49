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
        written = os.pwrite(fd, data, position)
        if written == len(data):
            return  # the common case, first: single appends call this once per record
        view = memoryview(data)[max(written, 0) :]
        position += max(written, 0)
        while view:
            written = os.pwrite(fd, view, position)
            if written <= 0:
                raise OSError(errno.EIO, "pwrite returned no progress")
            view = view[written:]
            position += written

    def pwritev(self, fd: int, buffers: list[bytes | memoryview], position: int) -> None:
        """Write ``buffers`` back to back at ``position`` (one system call when it can)."""
        written = os.pwritev(fd, buffers, position)
        total = sum(map(len, buffers))
        if written != total:
            self.pwrite(fd, b"".join(buffers)[written:], position + written)

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

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def fsync_dir(self, directory: str) -> None:
        fsync_dir(directory)

    def free_bytes(self, directory: str) -> int:
        stats = os.statvfs(directory)
        return stats.f_bavail * stats.f_frsize

    def write_atomic(self, directory: str, name: str, data: bytes) -> None:
        """Replace ``directory/name`` with ``data`` crash-safely.

        1. write a temporary ``name.<pid>.<n>.tmp`` (unique to this call, see
           ``filenames.temp_name``) and fsync it: a crash leaves a stray ``.tmp`` (removed
           on open) and the old file untouched;
        2. rename over ``name``: atomic, readers see old or new, never a mix;
        3. fsync the directory: the rename survives a power loss.

        Another process opening the log removes stray ``.tmp`` files; if it takes ours
        between steps 1 and 2, the rename finds nothing and the write starts over.
        """
        from .filenames import temp_name

        target = os.path.join(directory, name)
        for attempt in range(WRITE_ATOMIC_ATTEMPTS):
            temp = os.path.join(directory, temp_name(name))
            fd = self.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            try:
                self.write(fd, data)
                self.fsync(fd)
            except BaseException:
                self.close(fd)
                try:
                    self.remove(temp)
                except OSError:
                    pass  # a stray .tmp is removed on the next open
                raise
            self.close(fd)
            try:
                self.rename(temp, target)
            except FileNotFoundError:
                if attempt + 1 == WRITE_ATOMIC_ATTEMPTS:
                    raise
                continue
            break
        self.fsync_dir(directory)


def fsync_file(path: str) -> None:
    """fsync the file at ``path`` (written earlier through another descriptor)."""
    _fsync_opened(path, os.O_RDONLY)


def fsync_dir(directory: str) -> None:
    """fsync ``directory``: the entries created, renamed or removed in it survive a power
    loss (POSIX keeps a directory change only once the directory is fsynced)."""
    _fsync_opened(directory, os.O_RDONLY | os.O_DIRECTORY)


def _fsync_opened(path: str, flags: int) -> None:
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directories(fs: FileSystem, path: str) -> None:
    """``os.makedirs`` whose new entries survive a power loss: each directory created is
    fsynced in its parent (POSIX keeps a new entry only once its directory is fsynced)."""
    missing: list[str] = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            fs.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
        fs.fsync_dir(os.path.dirname(directory))


WRITE_ATOMIC_ATTEMPTS = 3
DEFAULT_FS = FileSystem()
