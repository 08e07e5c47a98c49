"""Unit tests of the compaction pieces: key digests, the offset map, columnar filtering,
the latest-state reader, statistics and the selection rules."""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

import numpy as np
import pytest

import compactlog
from compactlog.compaction import compact_log
from compactlog.compaction.columns import encode_filtered
from compactlog.encoding.batch_decode import decode_batch, filter_batch
from compactlog.encoding.format import CODEC_NONE, CODEC_ZSTD, check_batch
from compactlog.encoding.offset_map import BYTES_PER_ENTRY, OffsetMap, key_digests
from compactlog.engine.latest import latest_batches, latest_dict

from .compaction_helpers import Model, check_log
from .helpers import FakeClock


def digests_of(keys):
    lengths = np.array([len(k) for k in keys], dtype=np.int32)
    return key_digests(b"".join(keys), lengths)


def test_a_key_has_the_same_digest_in_any_batch():
    rng = random.Random(1)
    keys = [rng.randbytes(rng.randrange(0, 120)) for _ in range(500)]
    hi, lo = digests_of(keys)
    for i in range(0, 500, 7):
        one_hi, one_lo = digests_of([keys[i]])
        assert (one_hi[0], one_lo[0]) == (hi[i], lo[i])
    fixed = [k[:16].ljust(16, b"-") for k in keys]
    f_hi, f_lo = digests_of(fixed)  # the fixed-width fast path
    m_hi, m_lo = digests_of([*fixed, b"odd length"])  # the ragged path
    assert (f_hi == m_hi[:-1]).all() and (f_lo == m_lo[:-1]).all()


def test_digests_tell_apart_keys_that_differ_by_padding_or_one_bit():
    keys = [b"", b"\0", b"\0\0", b"a", b"a\0", b"abcdefgh", b"abcdefgh\0"]
    keys += [bytes([1 << b]) + b"x" * 20 for b in range(8)]
    hi, lo = digests_of(keys)
    assert len(set(zip(hi.tolist(), lo.tolist(), strict=True))) == len(keys)
    many = [b"user-%d" % i for i in range(200_000)]
    hi, lo = digests_of(many)
    assert len(set(zip(hi.tolist(), lo.tolist(), strict=True))) == len(many)


def test_long_keys_hash_with_blake2b():
    key = b"k" * 100
    hi, _lo = digests_of([key])
    digest = hashlib.blake2b(key, digest_size=16).digest()
    assert int(hi[0]) == int.from_bytes(digest[:8], "little")


def test_offset_map_keeps_the_latest_offset_and_24_bytes_per_key():
    m = OffsetMap(24 * 1000)
    rng = np.random.default_rng(3)
    pool = [b"key%d" % i for i in range(500)]
    model = {}
    offset = 0
    for _ in range(20):
        chosen = [pool[i] for i in rng.integers(0, 500, 100)]
        hi, lo = digests_of(chosen)
        assert m.put(hi, lo, np.arange(offset, offset + 100))
        for j, k in enumerate(chosen):
            model[k] = offset + j
        offset += 100
    m.flush()
    m._check()
    assert m.size_bytes == BYTES_PER_ENTRY * len(m) == BYTES_PER_ENTRY * len(model)
    keys = list(model)
    hi, lo = digests_of(keys)
    assert m.get(hi, lo).tolist() == [model[k] for k in keys]
    hi, lo = digests_of([b"absent"])
    assert m.get(hi, lo).tolist() == [-1]


def test_offset_map_stops_exactly_where_it_fills():
    m = OffsetMap(24 * 10)
    keys = [b"k%d" % (i % 15) for i in range(30)]
    hi, lo = digests_of(keys)
    m.put(hi, lo, np.arange(30))
    m.flush()
    assert m.full and m.full_at == 10 and len(m) == 10
    assert m.get(hi[:10], lo[:10]).tolist() == list(range(10))


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_ZSTD])
def test_filter_and_encode_keep_offsets_timestamps_headers(codec):
    from compactlog.encoding.batch_encode import encode_batch

    keys = [b"a", b"bb", None, b"dddd"]
    values = [b"1", None, b"33", b"4444"]
    heads = [{"x": b"1"}, None, {"y": b""}, None]
    encoded = encode_batch(keys, values, [5, 6, 7, 8], headers=heads)
    data = encoded.to_bytes(100)
    header, _ = check_batch(data, 0, len(data))
    batch = decode_batch(data, 0, header)
    mask = np.array([False, True, True, False])
    out = encode_filtered(filter_batch(batch, mask), codec, 3)
    header2, reason = check_batch(out, 0, len(out))
    assert header2 is not None, reason
    assert header2.base_offset == 100 and header2.last_delta == 3 and header2.count == 2
    records = list(decode_batch(out, 0, header2).records())
    assert [(r.offset, r.key, r.value, r.timestamp) for r in records] == [
        (101, b"bb", None, 6),
        (102, None, b"33", 7),
    ]
    assert records[1].headers == {"y": b""}


def test_latest_is_right_before_and_after_compaction(tmp_path):
    clock = FakeClock(10_000)
    model = Model()
    with compactlog.open(tmp_path / "log", clock=clock, segment_bytes=1024) as log:
        rng = random.Random(5)
        for i in range(600):
            key = b"k%d" % rng.randrange(50)
            model.append(log, key, None if rng.random() < 0.2 else b"v%d" % i)
        log.flush()
        assert latest_dict(log) == model.live()
        log.compact(force=True)
        assert latest_dict(log) == model.live()
        check_log(log, model)


@pytest.mark.parametrize(
    ("group", "remember"), [(1, 0), (3, 1 << 20), (64, 300), (1 << 16, 1 << 26)]
)
def test_latest_is_right_whatever_the_groups_and_the_remembered_dirty_section(
    tmp_path, monkeypatch, group, remember
):
    """``latest_batches`` judges consecutive batches together (``MASK_RECORDS``) and reads
    a small dirty section once (``REMEMBER_BYTES``): any group size, with or without the
    dirty section remembered, gives the model's state. Keys of different lengths,
    tombstones, single appends (small runs) and batches, before and after a pass."""
    import compactlog.engine.latest as latest_module

    monkeypatch.setattr(latest_module, "MASK_RECORDS", group)
    monkeypatch.setattr(latest_module, "REMEMBER_BYTES", remember)
    rng = random.Random(group)
    model: dict[bytes, bytes] = {}
    with compactlog.open(tmp_path / "log", segment_bytes=2048) as log:
        for round_ in range(3):
            for i in range(150):
                key = b"k" * rng.randrange(1, 4) + b"%d" % rng.randrange(40)
                value = None if rng.random() < 0.15 else b"v%d-%d" % (round_, i)
                if rng.random() < 0.5:
                    log.append(key, value)
                else:  # (a record of another key first: batches of two)
                    log.append_batch([(b"other%d" % i, b"o"), (key, value)])
                    model[b"other%d" % i] = b"o"
                if value is None:
                    model.pop(key, None)
                else:
                    model[key] = value
            log.flush()
            assert latest_dict(log) == model
            if round_ < 2:
                log.compact(force=True)
                assert latest_dict(log) == model


def test_latest_as_of_an_offset(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"a", b"1")
        log.append(b"b", b"1")
        log.append(b"a", b"2")
        log.append(b"b", None)
        assert latest_dict(log, as_of=2) == {b"a": b"1", b"b": b"1"}
        assert latest_dict(log, as_of=4) == {b"a": b"2"}
        assert [r.offset for r in log.latest()] == [2]
        batches = list(latest_batches(log))
        assert sum(len(b) for b in batches) == 1


def test_latest_on_an_empty_log(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        assert list(log.latest()) == []


def test_stats_report_like_kafka(tmp_path):
    with compactlog.open(tmp_path / "log", segment_bytes=1024) as log:
        for i in range(300):
            log.append(b"k%d" % (i % 10), b"x" * 20)
        log.flush()
        stats = log.compact(force=True)
        text = stats.summary("mylog")
        assert "size reduction" in text and "Buffer utilization" in text
        d = stats.to_dict()
        for name in (
            "bytes_read",
            "bytes_written",
            "records_removed",
            "tombstones_removed",
            "segments_before",
            "segments_after",
            "map_entries",
            "map_fill",
            "elapsed_seconds",
            "mb_per_second_read",
        ):
            assert name in d
        assert stats.records_read == stats.records_retained + stats.records_removed


def test_unforced_pass_on_a_clean_log_is_skipped(tmp_path):
    with compactlog.open(tmp_path / "log", segment_bytes=1024) as log:
        for i in range(300):
            log.append(b"k%d" % (i % 10), b"x" * 20)
        log.flush()
        assert log.compact().cleaned  # ratio 1.0 on a never-cleaned log
        stats = log.compact()
        assert not stats.cleaned and stats.skipped


def test_non_compacted_policies_only_run_retention(tmp_path):
    with compactlog.open(tmp_path / "log", cleanup_policy="delete") as log:
        log.append(b"k", b"v")
        stats = compact_log(log, force=True)
        assert not stats.cleaned and "does not compact" in stats.skipped
        assert stats.retention is not None


def test_keyless_records_are_kept(tmp_path):
    path = tmp_path / "log"
    with compactlog.open(path, cleanup_policy="delete", segment_bytes=1024) as log:
        for i in range(100):
            log.append(None if i % 3 == 0 else b"k", b"%d" % i * 10)
        log.flush()
    with compactlog.open(path) as log:  # as an earlier version let a reopen change the policy
        log.update_meta(config=replace(log.meta.config, cleanup_policy="compact"))
    with compactlog.open(path) as log:
        log.compact(force=True)
        keyless = [r for r in log.read() if r.key is None]
        assert len(keyless) == 34


def test_a_pass_removes_the_temporary_state_files_a_killed_cleaner_left(tmp_path):
    # A cleaner killed while writing its swap intent or checkpoint leaves `<name>.<pid>.<n>.tmp`;
    # a service that opens logs read-only never runs open-time recovery, so the next pass
    # (under the same cleaner lock) removes them. Other processes' temporary files stay.
    path = tmp_path / "log"
    with compactlog.open(path, segment_bytes=1024, sync="os") as log:
        for i in range(200):
            log.append(b"k%d" % (i % 4), b"v" * 40)
    stale = ["cleaner.swap.999999.1.tmp", "cleaner.checkpoint.999999.2.tmp"]
    foreign = "meta.999999.3.tmp"  # a writer's: recovery's to judge, not the cleaner's
    for name in [*stale, foreign]:
        (path / name).write_bytes(b"{")
    with compactlog.open(path, read_only=True) as log:  # as the cleaner service opens it
        stats = compact_log(log, force=True)
    assert all(not (path / name).exists() for name in stale)
    assert (path / foreign).exists()
    assert any("cleaner.swap.999999.1.tmp" in m for m in stats.extra["recovered"])
