"""Which records of the cleanable range are the latest of their key, in bounded memory.

The cleaner (``cleaner.py``, step 2) feeds :class:`LatestFinder` the key digests and
offsets of every keyed record of ``[start, end)`` (the clean tail and the dirty section,
ascending offsets), and gets back :class:`LatestOffsets`: a bitmap over ``[start, end)``
whose bit is set iff that offset is the latest of its key in the range. The rewrite (step 4)
reads only the bitmap: no digest, no search, and one rewrite per pass whatever the number
of keys.

Records go into one :class:`~compactlog.encoding.offset_map.OffsetMap` while their keys fit
it (``cleaner_buffer_bytes // 24``): no file is written. When the map fills, the finder
starts **spilling**: the map's entries (each key's latest offset so far, in offset order) and
every record after them go, as ``(hi, lo, offset)`` (24 bytes), to one of ``P`` spill files
(``cleaner.spill.<pid>.<n>.tmp``, temporary names of ``storage/filenames.py``) chosen by the
top bits of the digest, ``P`` a power of two of about ``(end - start)`` over the map's
capacity, at most :data:`MAX_PARTITIONS`. Each file is then read back in offset order into
a fresh offset map; a file whose keys outgrow the map is split :data:`SPLIT` ways by the
next digest bits (and its map dropped), and so on. A key's records all land in one file,
so each map's latest offsets are final.

I/O bound: the log is read once here and once by the rewrite, and written once; spill files
take 24 bytes per keyed record, written ``1 + s`` times and read at most ``1 + 2 s`` times
(the reads that found a file too big are cut short by the map's staging: about twice the
map's capacity), where ``s`` is the number of splits a record's file went through: ``s = 0``
while the range's distinct keys per partition fit the map, which ``P`` is chosen for. Memory:
one offset map (``cleaner_buffer_bytes``), a window of records and the bitmap, ``(end -
start) / 8`` bytes, kept in memory up to ``cleaner_buffer_bytes`` and mapped from a spill
file (``cleaner.spill.bits``) beyond.

Spill files are never trusted: written without fsync, removed when the pass ends (whatever
way), and, after a crash, removed by the next cleaner or the next open (temporary files).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import numpy as np

from ..encoding.offset_map import BYTES_PER_ENTRY, OffsetMap
from ..errors import Aborted, CompactLogError
from ..storage import filenames
from ..storage.fsio import FileSystem

RECORD = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("off", "<i8")])
MAX_PARTITIONS = 64  # spill files written at once by the first split
SPLIT_BITS = 4
SPLIT = 1 << SPLIT_BITS  # a file whose keys outgrow the map is split this many ways
READ_RECORDS = 1 << 16  # spilled records read back at once
assert RECORD.itemsize == BYTES_PER_ENTRY


class LatestOffsets:
    """A bitmap over offsets ``[start, end)``: set iff the offset is its key's latest."""

    def __init__(self, fs: FileSystem, directory: str, start: int, end: int, budget: int):
        self.start, self.end = start, end
        nbytes = (end - start + 7) // 8
        self.path: str | None = None
        if nbytes <= budget:
            self.bits: np.ndarray = np.zeros(nbytes, dtype=np.uint8)
            return
        self.path = os.path.join(directory, filenames.temp_name(filenames.SPILL_BITS))
        fd = fs.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            fs.truncate(fd, nbytes)
        finally:
            fs.close(fd)
        self.bits = np.memmap(self.path, dtype=np.uint8, mode="r+", shape=(nbytes,))

    def mark(self, offsets: np.ndarray) -> None:
        """Set the bits of ``offsets`` (distinct, inside the range, any order)."""
        if not len(offsets):
            return
        rel = np.sort(offsets - self.start)
        byte = rel >> 3
        values = (128 >> (rel & 7)).astype(np.uint8)
        firsts = np.flatnonzero(np.r_[True, byte[1:] != byte[:-1]])
        # distinct offsets: the bits of one byte are distinct powers of two, their sum an OR
        self.bits[byte[firsts]] |= np.add.reduceat(values, firsts, dtype=np.uint8)

    def contains(self, offsets: np.ndarray) -> np.ndarray:
        """Whether each offset (inside the range) is its key's latest."""
        rel = offsets - self.start
        return ((self.bits[rel >> 3] >> (7 - (rel & 7)).astype(np.uint8)) & 1).astype(bool)

    def close(self, fs: FileSystem) -> None:
        self.bits = np.zeros(0, dtype=np.uint8)  # drops the mapping before the remove
        if self.path is not None:
            _remove(fs, self.path)
            self.path = None


class LatestFinder:
    """Collects ``(hi, lo, offset)`` of a range in offset order; :meth:`finish` answers."""

    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        start: int,
        end: int,
        buffer_bytes: int,
        abort: Callable[[], bool],
        account: Callable[[int], None],
    ) -> None:
        self.fs, self.directory = fs, directory
        self.buffer_bytes = buffer_bytes
        self.abort, self.account = abort, account
        self.capacity = max(buffer_bytes // BYTES_PER_ENTRY, 1)
        self.latest = LatestOffsets(fs, directory, start, end, buffer_bytes)
        self.map: OffsetMap | None = OffsetMap(buffer_bytes)  # None once spilling
        self.unmerged: list[np.ndarray] = []  # records put since the map's last merge
        self.files: list[_SpillFile] = []
        self.bits = 0  # digest bits the first split uses
        self.span = end - start
        self.partitions = 0  # offset maps filled (files, or 1 without spilling)
        self.keys = 0  # distinct keys found
        self.peak_keys = 0  # the most keys one map held
        self.spill_bytes_written = 0
        self.spill_bytes_read = 0

    def _new_file(self) -> _SpillFile:
        return _SpillFile(self.fs, self.directory)

    def put(self, hi: np.ndarray, lo: np.ndarray, offsets: np.ndarray) -> None:
        """Take one window's keyed records (ascending offsets, after every earlier window)."""
        if self.map is None:
            self._spill(_records(hi, lo, offsets))
            return
        self.unmerged.append((hi, lo, offsets))
        if not self.map.put(hi, lo, offsets):
            self._start_spilling(self.unmerged)
            return
        # the map's stage is the last windows put: keep those, let the merged ones go
        staged = self.map.staged
        held = sum(len(w[2]) for w in self.unmerged)
        while self.unmerged and held - len(self.unmerged[0][2]) >= staged:
            held -= len(self.unmerged.pop(0)[2])

    def _start_spilling(self, unmerged: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """The map is full: its entries (the latest offset of every key so far, put in
        offset order) and the records it left out become the spill files' first records."""
        assert self.map is not None and self.map.full_at is not None
        full_at = self.map.full_at
        want = max(-(-self.span // self.capacity), 2)  # partitions of a map's records at most
        self.bits = min((want - 1).bit_length(), MAX_PARTITIONS.bit_length() - 1)
        self.files = [self._new_file() for _ in range(1 << self.bits)]
        order = np.argsort(self.map.off)
        self._spill(_records(self.map.hi[order], self.map.lo[order], self.map.off[order]))
        self.map = None
        self.unmerged = []
        for hi, lo, offsets in unmerged:
            left_out = offsets >= full_at
            self._spill(_records(hi[left_out], lo[left_out], offsets[left_out]))

    def _spill(self, records: np.ndarray) -> None:
        written = _distribute(records, self.files, 64 - self.bits, self.bits)
        self.spill_bytes_written += written
        self.account(written)

    def finish(self) -> LatestOffsets:
        """Resolve every map into the bitmap; the spill files are gone afterwards."""
        if self.map is not None:
            self.map.flush()  # the last merge may find the map full too
            if self.map.full_at is None:
                self._found(self.map)
                self.map = None
                return self.latest
            self._start_spilling(self.unmerged)
        files, self.files = self.files, []
        pending = [(f, 64 - self.bits) for f in files]
        for spill in files:
            spill.close_writer()
        while pending:
            spill, shift = pending.pop()
            try:
                pending.extend(self._resolve(spill, shift))
            except BaseException:
                spill.remove()
                for other, _shift in pending:
                    other.remove()
                raise
        return self.latest

    def _resolve(self, spill: _SpillFile, shift: int) -> list[tuple[_SpillFile, int]]:
        """One file into one map, or (keys too many) split: returns the files to do next.
        ``shift``: the digest bits below those that chose this file."""
        offset_map = OffsetMap(self.buffer_bytes)
        for chunk in spill.chunks():
            self.spill_bytes_read += chunk.nbytes
            self.account(chunk.nbytes)
            if self.abort():
                raise Aborted
            hi = np.ascontiguousarray(chunk["hi"])
            lo = np.ascontiguousarray(chunk["lo"])
            if not offset_map.put(hi, lo, np.ascontiguousarray(chunk["off"])):
                del offset_map
                return self._split(spill, shift)
        offset_map.flush()
        spill.remove()
        self._found(offset_map)
        return []

    def _split(self, spill: _SpillFile, shift: int) -> list[tuple[_SpillFile, int]]:
        if shift < SPLIT_BITS:  # 2**60 digests alike in their top bits: not keys, an attack
            spill.remove()
            raise CompactLogError(
                "more keys share a digest prefix than the offset map holds; raise "
                "cleaner_buffer_bytes"
            )
        parts = [self._new_file() for _ in range(SPLIT)]
        try:
            for chunk in spill.chunks():
                self.spill_bytes_read += chunk.nbytes
                self.account(chunk.nbytes)
                if self.abort():
                    raise Aborted
                written = _distribute(chunk, parts, shift - SPLIT_BITS, SPLIT_BITS)
                self.spill_bytes_written += written
                self.account(written)
        except BaseException:
            for part in parts:
                part.remove()
            raise
        finally:
            spill.remove()
        for part in parts:
            part.close_writer()
        return [(part, shift - SPLIT_BITS) for part in parts]

    def _found(self, offset_map: OffsetMap) -> None:
        offset_map.flush()
        self.latest.mark(offset_map.off)
        self.partitions += 1
        self.keys += len(offset_map)
        self.peak_keys = max(self.peak_keys, len(offset_map))

    def discard(self) -> None:
        """Remove every spill file (a pass that stops early)."""
        for spill in self.files:
            spill.remove()
        self.files = []
        self.latest.close(self.fs)


def _records(hi: np.ndarray, lo: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    records = np.empty(len(offsets), dtype=RECORD)
    records["hi"], records["lo"], records["off"] = hi, lo, offsets
    return records


def _distribute(records: np.ndarray, files: list[_SpillFile], shift: int, bits: int) -> int:
    """Append each record to ``files[(hi >> shift) & (2**bits - 1)]``, keeping offset order
    within each file; returns the bytes written."""
    part = ((records["hi"] >> np.uint64(shift)) & np.uint64((1 << bits) - 1)).astype(np.intp)
    order = np.argsort(part, kind="stable")
    counts = np.bincount(part, minlength=len(files))
    ordered = records[order]
    at = 0
    for spill, count in zip(files, counts.tolist(), strict=True):
        if count:
            spill.write(ordered[at : at + count])
            at += count
    return ordered.nbytes


class _SpillFile:
    """One spill file: appended to, then read back in chunks, then removed."""

    def __init__(self, fs: FileSystem, directory: str) -> None:
        self.fs = fs
        self.path = os.path.join(directory, filenames.temp_name(filenames.SPILL))
        self.fd = fs.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self.size = 0

    def write(self, records: np.ndarray) -> None:
        self.fs.write(self.fd, records.tobytes())
        self.size += records.nbytes

    def close_writer(self) -> None:
        if self.fd >= 0:
            self.fs.close(self.fd)
            self.fd = -1

    def chunks(self) -> Iterator[np.ndarray]:
        """The records written, :data:`READ_RECORDS` at a time."""
        self.close_writer()
        step = READ_RECORDS * RECORD.itemsize
        with open(self.path, "rb") as file:
            for position in range(0, self.size, step):
                want = min(step, self.size - position)
                data = file.read(want)
                if len(data) != want:
                    raise CompactLogError(f"spill file {self.path} is shorter than written")
                yield np.frombuffer(data, dtype=RECORD)

    def remove(self) -> None:
        self.close_writer()
        _remove(self.fs, self.path)


def _remove(fs: FileSystem, path: str) -> None:
    try:
        fs.remove(path)
    except FileNotFoundError:
        pass


__all__ = ["LatestFinder", "LatestOffsets"]
