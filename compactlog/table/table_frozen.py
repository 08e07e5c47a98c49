"""A restored state served straight from the batches that hold it, until its dict is built.

Why: a memory table's steady state is a ``dict``, but building one costs about 230 ns per
new key (hashing and inserting into a growing table), most of a restore. The batches of
``latest_batches`` already hold the state, one record per live key. :class:`FrozenState`
answers point reads from them after one vectorized step: the keys' ``hi`` digests
(``offset_map.key_digests``, the cleaner's) sorted with each key's row
(``offset_map.sort_order``). A read computes its key's digest in Python
(``key_digest_hi``), binary-searches the sorted array (``bisect`` over a ``memoryview``, in
C), compares the stored key's bytes and slices the value out of its batch: a few
microseconds instead of a dict's 0.1, so ``table.py`` builds the dict right after, in the
background (:meth:`FrozenState.to_dict`, in steps with a pause between them, so that
readers in other threads keep getting the interpreter).

Keys whose digests agree (distinct keys may) are neighbours in the sorted array, and a read
compares its key's bytes with each of them: an answer never rests on a digest alone.

Immutable but for the key objects, made once on first need under a lock of their own
(:meth:`FrozenState.key_objects`), so reads need no other lock.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from ..encoding.batch_decode import RecordBatch
from ..encoding.offset_map import key_digest_hi, key_digests, sort_order

THAW_STEP = 1 << 14  # records put into the dict between two pauses (a few milliseconds)
THAW_PAUSE_S = 0.0001  # the pause: another thread's turn with the interpreter


class FrozenState(Mapping[bytes, bytes]):
    """``{key: value}`` of batches in which every key appears at most once, no record is a
    tombstone and every record has a key (what ``latest_batches`` yields)."""

    def __init__(self, batches: list[RecordBatch]) -> None:
        self.batches = batches
        empty = np.zeros(0, np.int64)
        key_lengths = np.concatenate([b.key_lengths for b in batches]) if batches else empty
        value_lengths = np.concatenate([b.value_lengths for b in batches]) if batches else empty
        self._keys_blob = b"".join([batch.keys_blob for batch in batches])
        rows, ordered = sort_order(key_digests(self._keys_blob, key_lengths)[0])
        self._digests = memoryview(ordered)  # sorted; bisect compares its items as ints
        self._rows = memoryview(rows)
        key_ends = np.cumsum(key_lengths, dtype=np.int64)
        self._key_starts = memoryview(key_ends - key_lengths)
        self._key_ends = memoryview(key_ends)
        # a row's value: its batch (by the batch's first row) and its place in the batch's blob
        first_rows = np.cumsum([0, *(len(batch) for batch in batches)])[:-1]
        value_ends = np.cumsum(value_lengths, dtype=np.int64)
        value_starts = value_ends - value_lengths
        self._first_rows: list[int] = first_rows.tolist()
        self._batch_value_starts: list[int] = value_starts[first_rows].tolist()
        self._value_starts = memoryview(value_starts)
        self._value_ends = memoryview(value_ends)
        self._keys: list[bytes] = []  # the key objects of the first ``_keyed`` batches
        self._keyed = 0
        self._keys_made = threading.Lock()
        self.reads = 0  # point reads so far: the dict's builder pauses only while reads go on

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[bytes]:
        """The keys in log order (as a dict built by :meth:`to_dict` iterates them)."""
        return iter(self.key_objects())

    def key_objects(self) -> list[bytes]:
        """The keys as bytes objects in log order, made once: a key order built while
        frozen and the dict built after share them (one object per key, and the dict's
        lookups of the order's keys find them by identity)."""
        return self._keys_through(len(self.batches))

    def _keys_through(self, batches: int) -> list[bytes]:
        """The key objects, made (once) at least for the first ``batches`` batches: the
        dict's builder makes them a batch at a time, so it can stop between steps."""
        with self._keys_made:
            while self._keyed < batches:
                self._keys.extend(self.batches[self._keyed].keys())  # type: ignore[arg-type]
                self._keyed += 1
            return self._keys

    def __getitem__(self, key: object) -> bytes:
        row = self._row(key)
        if row < 0:
            raise KeyError(key)
        return self._value(row)

    def __contains__(self, key: object) -> bool:
        return self._row(key) >= 0

    def get(self, key: object, default: object = None) -> object:  # type: ignore[override]
        row = self._row(key)
        return default if row < 0 else self._value(row)

    def _row(self, key: object) -> int:
        """The row holding ``key``, or -1."""
        self.reads += 1  # (not atomic across threads: a rough count is all it is for)
        if not isinstance(key, bytes):
            hash(key)  # an unhashable key raises TypeError, as a dict's lookup does
            if not isinstance(key, memoryview):
                return -1  # (a dict of bytes keys holds nothing equal to it either)
            key = bytes(key)
        wanted = key_digest_hi(key)
        digests = self._digests
        i = bisect.bisect_left(digests, wanted)
        while i < len(digests) and digests[i] == wanted:
            row = self._rows[i]
            if self._keys_blob[self._key_starts[row] : self._key_ends[row]] == key:
                return row
            i += 1
        return -1

    def _value(self, row: int) -> bytes:
        number = bisect.bisect_right(self._first_rows, row) - 1
        base = self._batch_value_starts[number]
        blob = self.batches[number].values_blob
        return bytes(blob[self._value_starts[row] - base : self._value_ends[row] - base])

    def to_dict(self, stop: Callable[[], bool] = lambda: False) -> dict[bytes, bytes] | None:
        """The same state as a ``dict`` (keys in log order); ``None`` if ``stop()`` became
        true between steps.

        Built in steps of :data:`THAW_STEP` records with a :data:`THAW_PAUSE_S` sleep
        between them while the state is being read. Without the sleep a reader in another
        thread got under a tenth of its share of the interpreter (measured: 17k point
        reads/s against 227k alone): the numpy calls that cut each batch release and retake
        the GIL, and a waiter whose 5 ms timeout sees the GIL change hands never asks for
        it. Sleeping hands it over. With no read since the last step there is nobody to
        hand it to, and a sleep on a loaded machine costs far more than 0.1 ms: no pause."""
        data: dict[bytes, bytes] = {}
        row = done = 0
        reads = self.reads
        for number, batch in enumerate(self.batches):
            if done >= THAW_STEP:
                if stop():
                    return None
                if self.reads != reads:
                    reads = self.reads
                    time.sleep(THAW_PAUSE_S)
                done = 0
            keys = self._keys_through(number + 1)
            values = batch.values()
            data.update(zip(keys[row : row + len(values)], values, strict=True))  # type: ignore[arg-type]
            row += len(values)
            done += len(values)
        return data

    def _check(self) -> None:
        keys = list(self)
        assert len(set(keys)) == len(keys) == len(self)
        assert list(self._digests) == sorted(map(key_digest_hi, keys))
        assert sorted(self._rows) == list(range(len(keys)))
        for row, key in enumerate(keys):
            assert self._row(key) == row


__all__ = ["THAW_PAUSE_S", "THAW_STEP", "FrozenState"]
