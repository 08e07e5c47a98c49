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
(:meth:`FrozenState.key_objects`), and the batches that :meth:`FrozenState.to_dict` lets
go once their records are in the dict (a read finds a row in one or the other), so reads
need no other lock. Letting go bounds a restore's memory (measured: docs/tables.md).
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
DIGEST_GROUP_BYTES = 8 << 20  # keys joined and hashed at once when a state is frozen


class FrozenState(Mapping[bytes, bytes]):
    """``{key: value}`` of batches in which every key appears at most once, no record is a
    tombstone and every record has a key (what ``latest_batches`` yields).

    Memory: beside the batches, about 40 bytes per key (the sorted digests, each one's row,
    and where each row's key and value start in their batch's blobs; a key's bytes are
    compared in its batch, never copied into one blob). :meth:`to_dict` drops each batch
    once its records are in the dict, and rows of dropped batches are read from that dict,
    so the batches and the dict are never both whole: a restore peaks near the dict's size
    plus this index, not twice the state.
    """

    def __init__(self, batches: list[RecordBatch]) -> None:
        self.batches: list[RecordBatch | None] = list(batches)
        sizes = [len(batch) for batch in batches]
        self._first_rows: list[int] = np.cumsum([0, *sizes])[:-1].tolist()
        n = sum(sizes)
        # a row's key and value: global starts (``[row]`` to ``[row + 1]``), less the
        # start of its batch's first row, give its place in the batch's blobs
        self._key_starts = memoryview(_starts([b.key_lengths for b in batches], n))
        self._value_starts = memoryview(_starts([b.value_lengths for b in batches], n))
        self._batch_key_starts = [self._key_starts[row] for row in self._first_rows]
        self._batch_value_starts = [self._value_starts[row] for row in self._first_rows]
        rows, ordered = sort_order(_digests(batches, n))
        self._digests = memoryview(ordered)  # sorted; bisect compares its items as ints
        self._rows = memoryview(rows.astype(np.int32) if n < 1 << 31 else rows)
        self._keys: list[bytes] = []  # the key objects of the first ``_keyed`` batches
        self._keyed = 0
        self._keys_made = threading.Lock()
        self._dict: dict[bytes, bytes] = {}  # the records of the first ``_dropped`` batches
        self._dropped = 0  # batches put into ``_dict`` and let go (``to_dict``)
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
                batch = self.batches[self._keyed]
                assert batch is not None  # (a batch is dropped only once its keys are made)
                self._keys.extend(batch.keys())  # type: ignore[arg-type]
                self._keyed += 1
            return self._keys

    def __getitem__(self, key: object) -> bytes:
        row, number = self._row(key)
        if row < 0:
            raise KeyError(key)
        return self._value(row, number)

    def __contains__(self, key: object) -> bool:
        return self._row(key)[0] >= 0

    def get(self, key: object, default: object = None) -> object:  # type: ignore[override]
        row, number = self._row(key)
        return default if row < 0 else self._value(row, number)

    def _row(self, key: object) -> tuple[int, int]:
        """The row holding ``key`` and its batch's number, or ``(-1, -1)``."""
        self.reads += 1  # (not atomic across threads: a rough count is all it is for)
        if not isinstance(key, bytes):
            hash(key)  # an unhashable key raises TypeError, as a dict's lookup does
            if not isinstance(key, memoryview):
                return -1, -1  # (a dict of bytes keys holds nothing equal to it either)
            key = bytes(key)
        wanted = key_digest_hi(key)
        digests = self._digests
        i = bisect.bisect_left(digests, wanted)
        while i < len(digests) and digests[i] == wanted:
            row = self._rows[i]
            number = bisect.bisect_right(self._first_rows, row) - 1
            batch = self.batches[number]
            if batch is None:  # in the dict: its key object was made before it was dropped
                if self._keys[row] == key:
                    return row, number
            else:
                base = self._batch_key_starts[number]
                start, end = self._key_starts[row] - base, self._key_starts[row + 1] - base
                if batch.keys_blob[start:end] == key:
                    return row, number
            i += 1
        return -1, -1

    def _value(self, row: int, number: int) -> bytes:
        batch = self.batches[number]
        if batch is None:
            return self._dict[self._keys[row]]
        base = self._batch_value_starts[number]
        start, end = self._value_starts[row] - base, self._value_starts[row + 1] - base
        return bytes(batch.values_blob[start:end])

    def to_dict(self, stop: Callable[[], bool] = lambda: False) -> dict[bytes, bytes] | None:
        """The same state as a ``dict`` (keys in log order); ``None`` if ``stop()`` became
        true between steps (a later call goes on from there).

        Each batch is let go once its records are in the dict (reads of its rows then look
        in the dict). Built in steps of :data:`THAW_STEP` records with a
        :data:`THAW_PAUSE_S` sleep between them while the state is being read. Without the
        sleep a reader in another thread got under a tenth of its share of the interpreter
        (measured: 17k point reads/s against 227k alone): the numpy calls that cut each batch
        release and retake the GIL, and a waiter whose 5 ms timeout sees the GIL change hands
        never asks for it. Sleeping hands it over. With no read since the last step there is
        nobody to hand it to, and a sleep on a loaded machine costs far more than 0.1 ms: no
        pause. One builder at a time (the caller's lock)."""
        data = self._dict
        done = 0
        reads = self.reads
        for number in range(self._dropped, len(self.batches)):
            if done >= THAW_STEP:
                if stop():
                    return None
                if self.reads != reads:
                    reads = self.reads
                    time.sleep(THAW_PAUSE_S)
                done = 0
            keys = self._keys_through(number + 1)
            batch = self.batches[number]
            assert batch is not None
            values = batch.values()
            row = self._first_rows[number]
            data.update(zip(keys[row : row + len(values)], values, strict=True))  # type: ignore[arg-type]
            self.batches[number] = None  # (after the update: a read finds it in one or other)
            self._dropped = number + 1
            done += len(values)
        return data

    def _check(self) -> None:
        keys = list(self)
        assert len(set(keys)) == len(keys) == len(self)
        assert list(self._digests) == sorted(map(key_digest_hi, keys))
        assert sorted(self._rows) == list(range(len(keys)))
        for row, key in enumerate(keys):
            assert self._row(key)[0] == row


def _starts(lengths: list[np.ndarray], n: int) -> np.ndarray:
    """Where each of ``n`` items of the given lengths starts, laid end to end, and their end
    (``n + 1`` values)."""
    starts = np.zeros(n + 1, dtype=np.int64)
    if n:
        np.cumsum(np.concatenate(lengths), out=starts[1:])
    return starts


def _digests(batches: list[RecordBatch], n: int) -> np.ndarray:
    """The ``hi`` digests of every key of ``batches``, hashed a group of batches at a time
    (each group's keys joined: a copy of at most :data:`DIGEST_GROUP_BYTES` at once)."""
    hi = np.empty(n, dtype=np.uint64)
    row = 0
    group: list[RecordBatch] = []
    held = 0
    for number, batch in enumerate(batches):
        group.append(batch)
        held += len(batch.keys_blob)
        if held >= DIGEST_GROUP_BYTES or number == len(batches) - 1:
            lengths = np.concatenate([b.key_lengths for b in group])
            blob = b"".join([b.keys_blob for b in group])
            hi[row : row + len(lengths)] = key_digests(blob, lengths)[0]
            row += len(lengths)
            group, held = [], 0
    return hi


__all__ = ["THAW_PAUSE_S", "THAW_STEP", "FrozenState"]
