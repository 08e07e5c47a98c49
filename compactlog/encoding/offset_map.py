"""Key digests and the cleaner's offset map (Kafka's ``SkimpyOffsetMap``, in numpy).

Digests
    Every key is reduced to a 128-bit digest, two ``uint64`` lanes ``(hi, lo)``. Keys of at
    most :data:`VECTOR_KEY_BYTES` bytes are hashed for a whole batch at once with numpy, as
    zero-padded little-endian ``uint64`` words: keys of one length as a ``(n, words)``
    matrix, keys of varied lengths gathered a column at a time from the blob at each key's
    start (:class:`_Gathered`, in the same few numpy calls per column: no grouping or Python
    step per key). Each lane runs ``h = mix((h ^ word) * C)`` over the columns (a key of
    ``w`` words is mixed exactly ``w`` times, never more), then a
    ``fmix64`` finaliser (MurmurHash3's). The key length seeds both lanes, so ``b"a"`` and
    ``b"a\\0"`` differ. Every step is a bijection of ``h``, so two keys of equal length that
    differ in one word never collide in a lane; otherwise a lane behaves like a random
    64-bit function and the pair like a 128-bit one. The hash is not cryptographic: keys
    chosen by an adversary could be made to collide. Longer keys (rare) are hashed one by
    one with ``blake2b(digest_size=16)``. The same key always gets the same digest,
    whichever path hashes it.

Offset map
    :class:`OffsetMap` keeps, for each digest, the largest offset seen, in three parallel
    numpy arrays sorted by ``(hi, lo)``: exactly 24 bytes per key, at most
    ``cleaner_buffer_bytes // 24`` keys. Inserts are staged (up to :data:`MAX_STAGE`
    records, about the room left) and merged in bulk: sort the stage (:func:`sort_order`,
    stable, so a key's last record is its latest), drop duplicates keeping the latest
    offset, update keys already present in place and merge the new ones in (one pass over
    each array). When a merge would exceed the capacity, only the prefix of the stage (in
    offset order) whose new keys fit is merged, from the already sorted stage;
    :attr:`OffsetMap.full_at` then names the first offset left out, and the cleaner moves
    its cleaner point exactly that far. Lookups (:meth:`OffsetMap.get`) sort their queries
    first: numpy's ``searchsorted`` walks the map in order, several times faster than for
    random queries (a numpy open-addressing table was measured slower still: each probe
    round costs several whole-array operations). :meth:`OffsetMap.latest_bits` turns the
    map into a bitmap of the dirty section's latest offsets, which judges its records
    without hashing them.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable

import numpy as np

BYTES_PER_ENTRY = 24
VECTOR_KEY_BYTES = 64
MIN_STAGE = 64  # below this, a merge's fixed cost (tens of microseconds) dominates
MAX_STAGE = 1 << 18

_U64 = np.uint64
_C1 = _U64(0x9E3779B97F4A7C15)
_C2 = _U64(0xC2B2AE3D27D4EB4F)
_F1 = _U64(0xFF51AFD7ED558CCD)
_F2 = _U64(0xC4CEB9FE1A85EC53)
_SEED1 = _U64(0x243F6A8885A308D3)
_SEED2 = _U64(0x13198A2E03707344)
_S29 = _U64(29)
_S31 = _U64(31)
_S32 = _U64(32)
_S33 = _U64(33)


HASH_BLOCK = 16384  # keys hashed per block: the lanes and scratch stay in the CPU cache
Words = Callable[[int, int, int, np.ndarray], None]  # (column, first key, end, out)


def _fmix(h: np.ndarray, tmp: np.ndarray) -> None:
    """MurmurHash3's 64-bit finaliser, in place (``tmp``: scratch of the same shape)."""
    for multiplier in (_F1, _F2):
        np.right_shift(h, _S33, out=tmp)
        h ^= tmp
        h *= multiplier
    np.right_shift(h, _S33, out=tmp)
    h ^= tmp


def _hash_words(words: Words, lengths: np.ndarray, uniform: bool) -> tuple[np.ndarray, np.ndarray]:
    """Both lanes over keys given as little-endian ``uint64`` words.

    ``words(column, start, end, out)`` fills ``out`` with word ``column`` of keys
    ``start..end`` (zero-padded past a key's end). Lane 1: ``h = (h ^ w) * C1; h ^= h >> 32``;
    lane 2: ``h = (h + w) * C2; h ^= h >> 29; h ^= h >> 31``, both seeded with the length
    and finished with ``fmix64``. A key of ``k`` words is mixed ``k`` times: keys with fewer
    words keep their lanes while longer ones take a column (``uniform``: all keys have the
    same length, so none waits). Computed in blocks of :data:`HASH_BLOCK` keys with scratch
    arrays, so no temporary outgrows the cache.
    """
    n = len(lengths)
    hi = np.empty(n, dtype=np.uint64)
    lo = np.empty(n, dtype=np.uint64)
    block = min(n, HASH_BLOCK)
    word = np.empty(block, dtype=np.uint64)
    tmp = np.empty(block, dtype=np.uint64)
    new1 = np.empty(block, dtype=np.uint64)
    new2 = np.empty(block, dtype=np.uint64)
    counts = np.maximum((lengths + 7) >> 3, 1)
    for start in range(0, n, block):
        end = min(start + block, n)
        size = end - start
        h1 = hi[start:end]
        h2 = lo[start:end]
        w = word[:size]
        t = tmp[:size]
        np.copyto(w, lengths[start:end], casting="unsafe")
        np.multiply(w, _C1, out=h1)
        h1 ^= _SEED1
        np.multiply(w, _C2, out=h2)
        h2 ^= _SEED2
        block_counts = counts[start:end]
        fewest = int(block_counts[0]) if uniform else int(block_counts.min())
        most = fewest if uniform else int(block_counts.max())
        for column in range(most):
            words(column, start, end, w)
            every = column < fewest  # (else some keys are done: mix into scratch lanes)
            a = h1 if every else new1[:size]
            b = h2 if every else new2[:size]
            np.bitwise_xor(h1, w, out=a)
            a *= _C1
            np.right_shift(a, _S32, out=t)
            a ^= t
            np.add(h2, w, out=b)
            b *= _C2
            np.right_shift(b, _S29, out=t)
            b ^= t
            np.right_shift(b, _S31, out=t)
            b ^= t
            if not every:
                active = block_counts > column
                np.copyto(h1, a, where=active)
                np.copyto(h2, b, where=active)
        _fmix(h1, t)
        _fmix(h2, t)
    return hi, lo


def _blake(key: bytes) -> tuple[int, int]:
    digest = hashlib.blake2b(key, digest_size=16).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")


_MASK64 = (1 << 64) - 1
_WORDS = [struct.Struct(f"<{width}Q") for width in range(VECTOR_KEY_BYTES // 8 + 1)]
_INT_C1, _INT_F1, _INT_F2, _INT_SEED1 = int(_C1), int(_F1), int(_F2), int(_SEED1)


def key_digest_hi(key: bytes) -> int:
    """The ``hi`` lane of :func:`key_digests` for one key, in Python integers: a point
    lookup's digest, in a microsecond instead of numpy's tens of microseconds per call."""
    size = len(key)
    if size > VECTOR_KEY_BYTES:
        return _blake(key)[0]
    width = max((size + 7) // 8, 1)
    c1 = _INT_C1
    h = ((size * c1) & _MASK64) ^ _INT_SEED1
    for word in _WORDS[width].unpack(key.ljust(width * 8, b"\0")):
        h = ((h ^ word) * c1) & _MASK64
        h ^= h >> 32
    h ^= h >> 33
    h = (h * _INT_F1) & _MASK64
    h ^= h >> 33
    h = (h * _INT_F2) & _MASK64
    return h ^ (h >> 33)


_TAIL_MASKS = np.array(
    [0, *((1 << (8 * r)) - 1 for r in range(1, 8)), (1 << 64) - 1], dtype=np.uint64
)  # by bytes of a key left in a word, clipped to 0..8


class _Gathered:
    """:func:`_hash_words`'s ``words`` for keys of any lengths at ``starts`` of ``raw``.

    A block's bytes are copied once into an 8-byte aligned scratch buffer with zeros after
    them; a key's word at byte ``8 * i + r`` is two aligned gathers, the first word shifted
    down ``8 * r`` bits and the second up ``64 - 8 * r`` bits, ORed, then masked to the bytes
    left in the key (two aligned gathers cost far less than one of unaligned words; figures
    in docs/benchmarks.md, "Scale").
    """

    def __init__(self, raw: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> None:
        self.raw, self.starts, self.sizes = raw, starts, sizes
        self.block = -1  # the first key of the block in ``words``
        self.words = np.empty(0, "<u8")  # the block's bytes, from ``base``
        self.base = 0  # the block's first byte in ``raw``, rounded down to a multiple of 8
        block = min(len(starts), HASH_BLOCK)
        self.first = np.empty(block, np.int64)  # each key's first word in ``words``
        self.index = np.empty(block, np.int64)
        self.down = np.empty(block, np.uint64)  # 8 * r
        self.up = np.empty(block, np.uint64)  # 63 - 8 * r (then one more: 64 is no shift)
        self.high = np.empty(block, np.uint64)
        self.left = np.empty(block, np.int64)

    def _load(self, start: int, end: int) -> None:
        size = end - start
        starts = self.starts[start:end]
        base = int(starts[0]) & ~7
        stop = int(starts[-1] + self.sizes[end - 1])
        words = np.zeros((stop - base) // 8 + 2 + VECTOR_KEY_BYTES // 8, dtype="<u8")
        words.view(np.uint8)[: stop - base] = self.raw[base:stop]
        offsets = self.left[:size]
        np.subtract(starts, base, out=offsets)
        np.right_shift(offsets, 3, out=self.first[:size])
        offsets &= 7
        offsets <<= 3
        np.copyto(self.down[:size], offsets, casting="unsafe")
        np.subtract(_U64(63), self.down[:size], out=self.up[:size])
        self.words, self.block, self.base = words, start, base

    def __call__(self, column: int, start: int, end: int, out: np.ndarray) -> None:
        if self.block != start:
            self._load(start, end)
        size = end - start
        index, high = self.index[:size], self.high[:size]
        np.add(self.first[:size], column, out=index)
        np.take(self.words, index, out=out)
        out >>= self.down[:size]
        index += 1
        np.take(self.words, index, out=high)
        high <<= _U64(1)
        high <<= self.up[:size]
        out |= high
        left = self.left[:size]
        np.subtract(self.sizes[start:end], 8 * column, out=left)
        if int(left.min()) < 8:
            np.clip(left, 0, 8, out=left)
            out &= _TAIL_MASKS[left]


def key_digests(blob: bytes | memoryview, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """128-bit digests ``(hi, lo)`` of the keys laid end to end in ``blob``.

    ``lengths[i]`` is the length of key *i*; a negative length (no key) hashes as empty —
    callers keep keyless records out of the map.
    """
    n = len(lengths)
    if n == 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint64)
    raw = np.frombuffer(blob, dtype=np.uint8)
    sizes = np.maximum(lengths, 0).astype(np.int64)
    first = int(sizes[0])
    if first <= VECTOR_KEY_BYTES and bool((sizes == first).all()):
        width = max((first + 7) // 8, 1)
        matrix = raw[: n * first].reshape(n, first)
        if first % 8 or first == 0:
            matrix = np.zeros((n, width * 8), dtype=np.uint8)
            matrix[:, :first] = raw[: n * first].reshape(n, first)
        columns = np.ascontiguousarray(matrix).view("<u8")
        return _hash_words(
            lambda column, start, end, out: np.copyto(out, columns[start:end, column]),
            sizes,
            True,
        )
    starts = np.cumsum(sizes) - sizes
    short = sizes <= VECTOR_KEY_BYTES
    if bool(short.all()):
        return _hash_words(_Gathered(raw, starts, sizes), sizes, False)
    hi = np.empty(n, dtype=np.uint64)
    lo = np.empty(n, dtype=np.uint64)
    index = np.flatnonzero(short)
    if len(index):
        s_starts, s_sizes = starts[index], sizes[index]
        hi[index], lo[index] = _hash_words(_Gathered(raw, s_starts, s_sizes), s_sizes, False)
    view = memoryview(blob)
    for i in np.flatnonzero(~short).tolist():
        hi[i], lo[i] = _blake(bytes(view[int(starts[i]) : int(starts[i] + sizes[i])]))
    return hi, lo


def sort_order(hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A stable permutation sorting ``hi`` (equal values keep their order) and ``hi`` in
    that order, fast.

    The positions are packed into the low bits of the values and the packed words sorted
    with numpy's (SIMD) ``np.sort``, about three times faster than ``argsort``. Values that
    agree on their remaining high bits come out in position order, not value order; that is
    rare for digests and checked, with ``argsort(kind="stable")`` as the fallback.
    """
    n = len(hi)
    if n < 2:
        return np.arange(n, dtype=np.intp), hi.copy()
    bits = (n - 1).bit_length()
    low = _U64((1 << bits) - 1)
    packed = hi & ~low
    packed |= np.arange(n, dtype=np.uint64)
    packed.sort()
    packed &= low
    order = packed.view(np.int64)  # positions below 2**bits: the same values
    ordered = hi[order]
    if not bool((ordered[1:] >= ordered[:-1]).all()):
        order = np.argsort(hi, kind="stable")
        ordered = hi[order]
    return order, ordered


class OffsetMap:
    """Latest offset per key digest, in sorted numpy arrays (24 bytes per key).

    ``put`` stages ``(hi, lo, offset)`` triples given in offset order; ``get`` answers for a
    whole batch at once (and merges the stage first). ``full_at`` is ``None`` until an insert
    did not fit; then it is the offset of the first record left out.
    """

    def __init__(self, buffer_bytes: int) -> None:
        self.capacity = max(buffer_bytes // BYTES_PER_ENTRY, 1)
        self.hi = np.empty(0, dtype=np.uint64)
        self.lo = np.empty(0, dtype=np.uint64)
        self.off = np.empty(0, dtype=np.int64)
        self._stage: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._staged = 0
        self.full_at: int | None = None
        self.latest_offset = -1  # largest offset put so far (and accepted)
        self.inserts = 0
        self.merges = 0
        self._hi_shared = False  # do two entries share ``hi``? (2**-64 odds per pair)

    def __len__(self) -> int:
        return len(self.hi)

    @property
    def size_bytes(self) -> int:
        return self.hi.nbytes + self.lo.nbytes + self.off.nbytes

    @property
    def utilization(self) -> float:
        return len(self.hi) / self.capacity

    @property
    def full(self) -> bool:
        return self.full_at is not None

    # -- inserting ---------------------------------------------------------------------
    def _stage_limit(self) -> int:
        """Records to stage before a merge: the room left, or half the entries when that is
        more (a merge costs a pass over the arrays: staging half as many records keeps the
        cost per record constant while the map is full of keys being updated), at least
        :data:`MIN_STAGE`, at most :data:`MAX_STAGE` (bounds the merge's temporaries).

        Bounded by the room, not by a fixed minimum: a small map over a long dirty section stops
        after reading about twice what it covers (issue 8), instead of staging (and
        reading) a fixed 65,536 records before finding it was full."""
        room = self.capacity - len(self.hi)
        return max(MIN_STAGE, min(MAX_STAGE, max(room, len(self.hi) // 2)))

    @property
    def wanted(self) -> int:
        """Records the stage takes before its next merge (at least 1): the cleaner reads
        windows no longer than this, so a map that fills mid-segment stops reading there."""
        return max(self._stage_limit() - self._staged, 1)

    def put(self, hi: np.ndarray, lo: np.ndarray, offsets: np.ndarray) -> bool:
        """Stage one batch of keys (ascending offsets). False once the map is full: the
        caller stops feeding it and reads ``full_at``."""
        if self.full_at is not None:
            return False
        if len(offsets) == 0:
            return True
        if self._staged and self._staged + len(offsets) > self._stage_limit():
            self.flush()  # merge first: the stage never grows past the limit plus one put
            if self.full_at is not None:
                return False
        self._stage.append((hi, lo, offsets.astype(np.int64, copy=False)))
        self._staged += len(offsets)
        if self._staged >= self._stage_limit():
            self.flush()
        return self.full_at is None

    def flush(self) -> None:
        """Merge the stage into the sorted arrays (cut at the capacity)."""
        if not self._stage:
            return
        if len(self._stage) == 1:
            s_hi, s_lo, s_off = self._stage[0]
        else:
            s_hi = np.concatenate([s[0] for s in self._stage])
            s_lo = np.concatenate([s[1] for s in self._stage])
            s_off = np.concatenate([s[2] for s in self._stage])
        self._stage.clear()
        self._staged = 0
        self._merge(s_hi, s_lo, s_off)

    def _merge(self, s_hi: np.ndarray, s_lo: np.ndarray, s_off: np.ndarray) -> None:
        self.merges += 1
        order, o_hi = sort_order(s_hi)  # stable: equal digests stay in offset order
        o_lo = s_lo[order]
        same_hi = o_hi[1:] == o_hi[:-1]
        if bool((same_hi & (o_lo[1:] != o_lo[:-1])).any()):
            # distinct keys sharing ``hi``: sort by the whole digest so equal keys are adjacent
            order = np.lexsort((s_lo, s_hi))
            o_hi = s_hi[order]
            o_lo = s_lo[order]
            same_hi = o_hi[1:] == o_hi[:-1]
        self._merge_sorted(order, o_hi, o_lo, s_off, len(s_off), same_hi)

    def _merge_sorted(
        self,
        order: np.ndarray,
        o_hi: np.ndarray,
        o_lo: np.ndarray,
        s_off: np.ndarray,
        end: int,
        same_hi: np.ndarray | None = None,
    ) -> None:
        """Merge the stage records at positions ``order`` (all below ``end``), given sorted
        by digest, equal digests in position order (``same_hi``: ``o_hi[1:] == o_hi[:-1]``,
        when the caller has it)."""
        count = len(order)
        same = o_hi[1:] == o_hi[:-1] if same_hi is None else same_hi
        same &= o_lo[1:] == o_lo[:-1]
        # a key's first occurrence is its smallest stage position and its last occurrence
        # its latest (largest) offset: the sort is stable and offsets ascend
        last = np.empty(count, dtype=bool)
        last[-1] = True
        np.logical_not(same, out=last[:-1])
        lasts = np.flatnonzero(last)
        del last
        u_hi = o_hi[lasts]
        u_lo = o_lo[lasts]
        u_off = s_off[order[lasts]]
        del lasts
        found, where = self._locate_sorted(u_hi, u_lo)
        new = ~found
        new_count = int(new.sum())
        room = self.capacity - len(self.hi)
        if new_count > room:
            # keep the prefix of the stage (offset order) whose new keys fit: the records
            # before the first occurrence of the first new key that does not fit
            first = np.empty(count, dtype=bool)
            first[0] = True
            np.logical_not(same, out=first[1:])
            first_positions = np.sort(order[np.flatnonzero(first)][new])
            cut = int(first_positions[room])
            del first, same, u_hi, u_lo, u_off, found, where, new
            if cut > 0:
                inside = order < cut  # still sorted, still stable
                self._merge_sorted(order[inside], o_hi[inside], o_lo[inside], s_off, cut)
            self.full_at = int(s_off[cut])
            return
        self.inserts += count
        self.latest_offset = max(self.latest_offset, int(s_off[end - 1]))
        if found.any():
            self.off[where[found]] = u_off[found]
        if new_count:
            self._insert(u_hi[new], u_lo[new], u_off[new], where[new])

    def _insert(
        self, n_hi: np.ndarray, n_lo: np.ndarray, n_off: np.ndarray, left: np.ndarray
    ) -> None:
        """Insert new (sorted, distinct, absent) digests; ``left`` is where ``searchsorted``
        put each among the entries (``side="left"``)."""
        size = len(self.hi)
        count = len(n_hi)
        if size and bool((self.hi[np.minimum(left, size - 1)] == n_hi).any()):
            positions = self._insert_positions(n_hi, n_lo)  # an entry shares ``hi``
        else:
            positions = left
        if count > 1 and bool((n_hi[1:] == n_hi[:-1]).any()):
            self._hi_shared = True
        # the merged arrays: new entries at ``positions + i``, the old ones in the rest
        slots = positions + np.arange(count)
        old = np.ones(size + count, dtype=bool)
        old[slots] = False
        for name, values in (("hi", n_hi), ("lo", n_lo), ("off", n_off)):
            current = getattr(self, name)
            merged = np.empty(size + count, dtype=current.dtype)
            merged[slots] = values
            merged[old] = current
            setattr(self, name, merged)
            del current

    # -- searching ---------------------------------------------------------------------
    def _locate_sorted(self, q_hi: np.ndarray, q_lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, index of the entry where found, else ``searchsorted``'s insertion
        point) for query digests sorted by ``hi``
        (numpy's ``searchsorted`` reuses the last bound: sorted queries search several
        times faster than random ones)."""
        size = len(self.hi)
        if size == 0:
            return np.zeros(len(q_hi), dtype=bool), np.zeros(len(q_hi), dtype=np.intp)
        left = np.searchsorted(self.hi, q_hi, side="left")
        clipped = np.minimum(left, size - 1)
        found = self.hi[clipped] == q_hi
        found &= self.lo[clipped] == q_lo
        if self._hi_shared:
            # entries sharing ``hi`` (a 64-bit partial collision): check them one by one
            right = np.searchsorted(self.hi, q_hi, side="right")
            for i in np.flatnonzero((right - left > 1) & ~found).tolist():
                for j in range(int(left[i]), int(right[i])):
                    if self.lo[j] == q_lo[i]:
                        found[i] = True
                        left[i] = j
                        break
        return found, left

    def _insert_positions(self, n_hi: np.ndarray, n_lo: np.ndarray) -> np.ndarray:
        """Where to insert new (sorted, distinct, absent) digests to keep ``(hi, lo)`` order
        when some share ``hi`` with an entry."""
        left = np.searchsorted(self.hi, n_hi, side="left")
        right = np.searchsorted(self.hi, n_hi, side="right")
        shared = np.flatnonzero(right > left)
        if len(shared):
            self._hi_shared = True
        positions = left
        for i in shared.tolist():
            j = int(left[i])
            while j < int(right[i]) and self.lo[j] < n_lo[i]:
                j += 1
            positions[i] = j
        return positions

    def latest_bits(self, start: int, end: int) -> np.ndarray:
        """A bitmap (``np.packbits`` order) over offsets ``[start, end)``: bit ``o - start``
        is set iff ``o`` is the latest offset of a key in the map. Once the map holds every
        keyed record of ``[start, end)``, a record there is the latest of its key iff its
        bit is set: no digest, no search. ``(end - start) / 8`` bytes."""
        self.flush()
        bits = np.zeros((end - start + 7) // 8, dtype=np.uint8)
        inside = self.off[(self.off >= start) & (self.off < end)] - start
        np.bitwise_or.at(bits, inside >> 3, (128 >> (inside & 7)).astype(np.uint8))
        return bits

    def get(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """The latest offset of each digest, -1 where the key is not in the map.

        Ask for many keys at once (a window of batches): the queries are sorted first.
        """
        self.flush()
        result = np.full(len(hi), -1, dtype=np.int64)
        if len(self.hi) == 0 or len(hi) == 0:
            return result
        order, ordered = sort_order(hi)
        found, where = self._locate_sorted(ordered, lo[order])
        hits = np.flatnonzero(found)
        result[order[hits]] = self.off[where[hits]]
        return result

    def _check(self) -> None:
        """Invariants: sorted by (hi, lo), distinct, within capacity, ``_hi_shared`` set
        whenever two entries share ``hi``, offsets at most the latest put."""
        assert len(self.hi) == len(self.lo) == len(self.off) <= self.capacity
        assert self.hi.dtype == self.lo.dtype == np.uint64 and self.off.dtype == np.int64
        if len(self.hi) > 1:
            order = np.lexsort((self.lo, self.hi))
            assert (order == np.arange(len(order))).all(), "offset map not sorted"
            same_hi = self.hi[1:] == self.hi[:-1]
            same = same_hi & (self.lo[1:] == self.lo[:-1])
            assert not same.any(), "duplicate digest in offset map"
            assert self._hi_shared or not same_hi.any(), "shared hi not flagged"
        if len(self.off):
            assert int(self.off.max()) <= self.latest_offset
