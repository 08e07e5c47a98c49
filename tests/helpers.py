"""Helpers of the storage-engine suite: byte damage, a fake clock, record derivation."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from compactlog.encoding.batch_decode import RecordBatch, _decode_columns, batch_body
from compactlog.encoding.batch_encode import encode_batch
from compactlog.encoding.format import BATCH_HEADER, FILE_HEADER, BatchHeader, read_batch_header
from compactlog.storage.fsio import FileSystem

SEGMENT_HEADER_SIZE = FILE_HEADER.size


def run_python(code: str, *args: str, timeout: float = 60) -> str:
    """Run ``code`` in another Python process with ``args`` (what another process sees);
    returns its output, and fails the test with its stderr if it exits non-zero."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, timeout=timeout)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


class FakeClock:
    """A clock in ms for ``compactlog.open(clock=...)``; ``advance`` moves it."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


# -- byte damage ---------------------------------------------------------------------------


def segment_files(directory: str | os.PathLike[str]) -> list[Path]:
    return sorted(Path(directory).glob("*.log"))


def batch_positions(path: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """(position, length) of every whole batch in a segment file, parsed from headers only."""
    data = Path(path).read_bytes()
    pos = SEGMENT_HEADER_SIZE
    found = []
    while pos < len(data):
        header, _reason = read_batch_header(data, pos, len(data))
        if header is None:
            break
        found.append((pos, header.length))
        pos += header.length
    return found


def flip_bit(path: str | os.PathLike[str], position: int, bit: int = 0) -> None:
    """Invert one bit of the file at ``position``."""
    with open(path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([byte ^ (1 << bit)]))


def cut_out(path: str | os.PathLike[str], start: int, length: int) -> None:
    """Remove ``length`` bytes at ``start`` (a batch truncated in the middle of a file)."""
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:start] + data[start + length :])


def truncate(path: str | os.PathLike[str], length: int) -> None:
    os.truncate(path, length)


def append_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def body_position(batch_position: int) -> int:
    """A byte inside a batch's body (past its header)."""
    return batch_position + BATCH_HEADER.size + 1


# -- records whose contents are derived from their identity -----------------------------------


def value_for(key: bytes, size: int = 40) -> bytes:
    """A value that can be checked from its key alone."""
    digest = hashlib.blake2b(key, digest_size=16).digest()
    return (digest * (size // 16 + 1))[:size]


def check_record(record) -> None:
    assert record.key is not None
    assert record.value == value_for(record.key, len(record.value)), record


# -- fault injection through the I/O seam ---------------------------------------------------


class FailingFS(FileSystem):
    """Fails the next ``failures`` segment writes with ``error`` (then behaves)."""

    def __init__(self, error: int) -> None:
        self.error = error
        self.failures = 0
        self.free = None  # when set: what free_bytes reports

    def _maybe_fail(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise OSError(self.error, os.strerror(self.error))

    def pwritev(self, fd, buffers, position):
        self._maybe_fail()
        return super().pwritev(fd, buffers, position)

    def free_bytes(self, directory: str) -> int:
        if self.free is not None:
            return self.free
        return super().free_bytes(directory)


def assert_run_matches(batch, covered) -> None:
    """``batch``, a run decoded at once, holds exactly the records of the stored batches
    ``covered`` decoded one by one, column by column."""
    assert batch.offsets.tolist() == [o for b in covered for o in b.offsets.tolist()]
    assert batch.timestamps.tolist() == [t for b in covered for t in b.timestamps.tolist()]
    assert batch.key_lengths.tolist() == [n for b in covered for n in b.key_lengths.tolist()]
    assert batch.value_lengths.tolist() == [n for b in covered for n in b.value_lengths.tolist()]
    assert bytes(batch.keys_blob) == b"".join(bytes(b.keys_blob) for b in covered)
    assert bytes(batch.values_blob) == b"".join(bytes(b.values_blob) for b in covered)
    assert batch.headers() == [h for b in covered for h in b.headers()]
    assert batch.keys() == [key for b in covered for key in RecordBatch.keys(b)]
    assert batch.values() == [value for b in covered for value in RecordBatch.values(b)]
    assert batch.base_offset == covered[0].base_offset
    assert batch.next_offset == covered[-1].next_offset


# -- batch references ----------------------------------------------------------------------


def decode_columns(buf: bytes | memoryview, pos: int, header: BatchHeader) -> RecordBatch:
    """``batch_decode.decode_batch`` always through the columnar path (the reference the
    fast paths are tested against)."""
    return _decode_columns(batch_body(buf, pos, header), pos, header)


def encode_record_batch(
    batch: RecordBatch, base_offset: int, last_delta: int, codec: int, level: int
) -> bytes:
    """Re-encode a (filtered) columnar batch, keeping offsets, timestamps and headers."""
    deltas = (batch.offsets - base_offset).astype(np.uint32)
    heads = batch.headers() if batch.header_lengths is not None else None
    return encode_batch(
        batch.keys(),
        batch.values(),
        batch.timestamps.tolist(),
        headers=heads,
        offset_deltas=deltas,
        last_delta=last_delta,
        codec=codec,
        level=level,
    ).to_bytes(base_offset)
