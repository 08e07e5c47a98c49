"""The cleaner's fast paths agree with the simple definitions they replace.

Each fast path has a slow, obviously right counterpart: the fused filter-and-encode
(:class:`KeptColumns`) against ``encode_filtered(filter_batch(...))``, the offset map
against a dict, the head bitmap against lookups by digest, blockwise hashing against one
block, the packed sort against ``argsort``. A cleaning pass also leaves no descriptor open
on the segments it replaced.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.compaction import cleaner
from compactlog.compaction.columns import KeptColumns, encode_filtered, encode_kept
from compactlog.encoding import offset_map
from compactlog.encoding.batch_decode import decode_batch, filter_batch
from compactlog.encoding.batch_encode import encode_batch
from compactlog.encoding.format import CODEC_NONE, CODEC_ZSTD, check_batch
from compactlog.encoding.offset_map import OffsetMap, key_digest_hi, key_digests, sort_order
from compactlog.storage.segment import list_segments

from .compaction_helpers import Model, check_log
from .helpers import FakeClock


def _decoded(rng, n, base, key_mode, value_mode):
    def key():
        if key_mode == "none":
            return rng.choice([None, b"k" * rng.randrange(0, 9)])
        if key_mode == "var":
            return rng.randbytes(rng.randrange(0, 30))
        return rng.randbytes(key_mode)

    keys = [key() for _ in range(n)]
    values = [
        None
        if value_mode != "fixed" and rng.random() < 0.3
        else b"v" * (7 if value_mode != "var" else rng.randrange(0, 20))
        for _ in range(n)
    ]
    timestamps = rng.choice([5, [rng.randrange(100) for _ in range(n)]])
    heads = rng.choice(
        [None, [rng.choice([None, {"a": b"x" * rng.randrange(3)}]) for _ in range(n)]]
    )
    deltas = None
    if rng.random() < 0.5:
        deltas = np.array(sorted(rng.sample(range(3 * n), n)), dtype=np.uint32)
        deltas -= deltas[0]
    encoded = encode_batch(
        keys, values, timestamps, headers=heads, offset_deltas=deltas, codec=rng.choice([0, 1])
    )
    data = encoded.to_bytes(base)
    header, reason = check_batch(data, 0, len(data))
    assert header is not None, reason
    return decode_batch(data, 0, header)


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_ZSTD])
def test_encode_kept_writes_the_bytes_of_filter_then_encode(codec):
    rng = random.Random(11)
    for _ in range(400):
        n = rng.randrange(1, 40)
        batch = _decoded(
            rng,
            n,
            1000,
            rng.choice(["none", 0, 5, 16, "var"]),
            rng.choice(["fixed", "var", "tomb"]),
        )
        keep = np.array([rng.random() < 0.6 for _ in range(n)])
        keep[rng.randrange(n)] = True
        header, body = encode_kept(batch, keep, codec, 3)
        assert header + bytes(body) == encode_filtered(filter_batch(batch, keep), codec, 3)


def test_kept_columns_encode_each_batch_of_a_window_like_the_batch_alone():
    rng = random.Random(12)
    for _ in range(200):
        window, keeps = [], []
        for j in range(rng.randrange(1, 6)):
            n = rng.randrange(1, 30)
            window.append(_decoded(rng, n, 100 * j, rng.choice([16, "var", "none"]), "tomb"))
            keeps.append(np.array([rng.random() < 0.5 for _ in range(n)]))
        counts = [len(b) for b in window]
        ends = np.cumsum(counts).tolist()
        starts = [e - c for e, c in zip(ends, counts, strict=True)]
        kept = KeptColumns(
            window,
            np.concatenate(keeps),
            np.concatenate([b.offsets for b in window]),
            np.concatenate([b.key_lengths for b in window]),
            np.concatenate([b.value_lengths for b in window]),
            starts,
            ends,
        )
        for i, batch in enumerate(window):
            if keeps[i].any():
                header, body = kept.encode(i, CODEC_NONE, 3)
                expected = encode_filtered(filter_batch(batch, keeps[i]), CODEC_NONE, 3)
                assert header + bytes(body) == expected


@pytest.mark.parametrize("min_stage", [1, 3, 10, 1 << 16])
def test_offset_map_matches_a_dict_up_to_where_it_fills(monkeypatch, min_stage):
    """Latest offset per key, ``full_at`` at the first record whose key did not fit, and the
    invariants of ``_check`` after every flush; some keys share ``hi`` on purpose."""
    monkeypatch.setattr(offset_map, "MIN_STAGE", min_stage)
    rng = random.Random(min_stage)
    for _ in range(150):
        capacity = rng.randrange(1, 60)
        m = OffsetMap(24 * capacity)
        n_keys = rng.randrange(1, 120)
        hi_of = [rng.choice([rng.getrandbits(64), 5, 6]) for _ in range(n_keys)]
        lo_of = [rng.getrandbits(64) for _ in range(n_keys)]
        puts, offset = [], 0
        for _ in range(rng.randrange(1, 20)):
            chosen = [rng.randrange(n_keys) for _ in range(rng.randrange(0, 30))]
            puts.append((chosen, offset))
            offset += len(chosen)
        for chosen, start in puts:
            hi = np.array([hi_of[k] for k in chosen], dtype=np.uint64)
            lo = np.array([lo_of[k] for k in chosen], dtype=np.uint64)
            if not m.put(hi, lo, np.arange(start, start + len(chosen))):
                break
        m.flush()
        m._check()
        latest: dict[tuple[int, int], int] = {}
        full_at = None
        for chosen, start in puts:
            for j, k in enumerate(chosen):
                digest = (hi_of[k], lo_of[k])
                if digest not in latest and len(latest) == capacity:
                    full_at = start + j
                    break
                latest[digest] = start + j
            if full_at is not None:
                break
        assert m.full_at == full_at
        assert len(m) == len(latest)
        digests = list(latest)
        hi = np.array([d[0] for d in digests], dtype=np.uint64)
        lo = np.array([d[1] for d in digests], dtype=np.uint64)
        assert m.get(hi, lo).tolist() == [latest[d] for d in digests]


def test_offset_map_check_catches_broken_invariants():
    m = OffsetMap(24 * 100)
    hi, lo = key_digests(b"".join(b"k%02d" % i for i in range(50)), np.full(50, 3, np.int32))
    m.put(hi, lo, np.arange(50))
    m.flush()
    m._check()
    m.hi[[0, 1]] = m.hi[[1, 0]]
    with pytest.raises(AssertionError):
        m._check()


def test_latest_bits_mark_exactly_the_latest_offset_of_each_key():
    m = OffsetMap(24 * 100)
    keys = [b"k%d" % (i % 7) for i in range(40)]
    hi, lo = key_digests(b"".join(keys), np.array([len(k) for k in keys], np.int32))
    m.put(hi, lo, np.arange(100, 140))
    bits = np.unpackbits(m.latest_bits(100, 140))[:40]
    expected = [max(i for i in range(40) if keys[i] == key) for key in set(keys)]
    assert np.flatnonzero(bits).tolist() == sorted(expected)


def test_blockwise_hashing_gives_the_same_digests(monkeypatch):
    rng = random.Random(4)
    keys = [rng.randbytes(rng.choice([3, 16, 16, 40])) for _ in range(5000)]
    blob = b"".join(keys)
    lengths = np.array([len(k) for k in keys], np.int32)
    hi, lo = key_digests(blob, lengths)
    monkeypatch.setattr(offset_map, "HASH_BLOCK", 7)
    hi7, lo7 = key_digests(blob, lengths)
    assert (hi == hi7).all() and (lo == lo7).all()
    assert len(set(zip(hi.tolist(), lo.tolist(), strict=True))) == len(set(keys))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=80), min_size=1, max_size=60), st.sampled_from([1, 3, 16384]))
def test_a_keys_digest_does_not_depend_on_its_neighbours(keys: list[bytes], block: int) -> None:
    """Keys of mixed lengths, hashed together in blocks of any size, get the digests each
    key gets alone (where all keys share one length) and ``key_digest_hi``'s lane."""
    lengths = np.array([len(k) for k in keys], np.int32)
    original = offset_map.HASH_BLOCK
    offset_map.HASH_BLOCK = block
    try:
        hi, lo = key_digests(b"".join(keys), lengths)
    finally:
        offset_map.HASH_BLOCK = original
    for key, h, g in zip(keys, hi.tolist(), lo.tolist(), strict=True):
        alone = key_digests(key, np.array([len(key)], np.int32))
        assert (int(alone[0][0]), int(alone[1][0])) == (h, g)
        assert key_digest_hi(key) == h


def test_sort_order_is_a_stable_sort_even_when_high_bits_tie():
    rng = np.random.default_rng(9)
    values = rng.integers(0, 2**64 - 1, 3000, dtype=np.uint64)
    values[::7] = values[3]  # equal values: stable order
    values[1::11] = np.uint64(5) + np.arange(len(values[1::11]), dtype=np.uint64)[::-1]
    order, ordered = sort_order(values)  # the tiny descending run ties on the high bits
    assert (order == np.argsort(values, kind="stable")).all()
    assert (ordered == values[order]).all()


def test_head_bitmap_and_digest_lookups_clean_the_same_bytes(tmp_path, monkeypatch):
    """The head's records are judged by the bitmap of the map's offsets; forcing lookups by
    digest instead (as for a head too long for a bitmap) writes the very same files."""

    def run(path, bitmap_limit):
        monkeypatch.setattr(cleaner, "BITMAP_OFFSETS_PER_KEY", bitmap_limit)
        clock = FakeClock(10_000)
        model = Model()
        rng = random.Random(8)
        config = dict(segment_bytes=2048, cleaner_buffer_bytes=4096, delete_retention_ms=0)
        with compactlog.open(path, clock=clock, **config) as log:
            for i in range(1500):
                key = b"k%03d" % rng.randrange(300)
                value = None if rng.random() < 0.1 else b"v%d" % i
                model.append(log, key, value, headers={"h": b"1"} if i % 5 == 0 else None)
            log.flush()
            while True:
                stats = log.compact(force=True)
                clock.advance(1)
                if not stats.map_full:
                    break
            check_log(log, model)
            directory = log.directory
            return {
                name: open(os.path.join(directory, name), "rb").read()
                for name in sorted(os.listdir(directory))
                if name.endswith(".log")
            }

    with_bitmap = run(tmp_path / "a", cleaner.BITMAP_OFFSETS_PER_KEY)
    with_lookups = run(tmp_path / "b", 0)
    assert with_bitmap == with_lookups


def test_a_pass_keeps_no_descriptor_on_replaced_segments(tmp_path):
    with compactlog.open(tmp_path / "log", segment_bytes=1024) as log:
        for i in range(600):
            log.append(b"k%d" % (i % 30), b"x" * 20)
        log.flush()
        before = len(list_segments(log.directory))
        stats = log.compact(force=True)
        assert stats.groups_swapped and len(list_segments(log.directory)) < before
        fd_dir = "/proc/self/fd"
        if not os.path.isdir(fd_dir):
            pytest.skip("no /proc")
        targets = []
        for fd in os.listdir(fd_dir):
            try:
                targets.append(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                pass
        assert not [t for t in targets if t.endswith("(deleted)") and ".log" in t]
