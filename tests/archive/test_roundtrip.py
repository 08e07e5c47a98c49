"""Archive a log under appends and compaction, lose the machine, restore: the model's state.

The key runs are on SeaweedFS (a real S3 server); the cheaper shapes on memory:// and
file:// too.
"""

from __future__ import annotations

import os
import random
import re
import shutil

import pytest

import compactlog
from compactlog.archive import (
    FaultyStore,
    ObjectCorruptError,
    ObjectMissingError,
    RestoreTargetError,
    StoreError,
    open_store,
)
from compactlog.archive import manifest as manifests
from compactlog.archive.follow import Follower
from compactlog.archive.prune import prune
from compactlog.archive.push import Archiver, push_once
from compactlog.archive.restore import restore
from compactlog.archive.run import run
from compactlog.archive.verify import verify
from compactlog.errors import CorruptLogError

from ..helpers import batch_positions
from .helpers import Model, new_log, records_of, segment_bytes_of, state_of


def archive_rounds(tmp_path, url, rounds=12, seed=1, compact_every=3):
    """Appends, compactions and pushes; returns the model, the source path and, for every
    committed manifest, (sequence, end offset, the source's records then)."""
    rng = random.Random(seed)
    source = tmp_path / "source"
    log = new_log(source)
    reader = compactlog.open(source, read_only=True)
    ticks = iter(range(1_700_000_000_000, 1 << 62, 1000))
    archiver = Archiver(reader, open_store(url), clock=lambda: next(ticks))
    archiver.start()
    model = Model()
    committed = []
    try:
        for round_ in range(rounds):
            model.append(log, rng, rng.choice((1, 7, 60, 200)))
            if round_ % compact_every == compact_every - 1:
                log.compact(force=True)
            result = archiver.push()
            if result.manifest is not None:
                end = result.manifest.end_offset
                committed.append((result.manifest.sequence, end, records_of(source, end)))
    finally:
        archiver.stop()
        reader.close()
        log.close()
    return model, source, committed


def fail_object_gets_after(count):
    """A ``FaultyStore`` plan: the first ``count`` object gets succeed, the rest fail."""
    gets = [0]

    def plan(op, key):
        if op == "get" and key.startswith("objects/"):
            gets[0] += 1
            return "before" if gets[0] > count else None
        return None

    return plan


def test_restore_after_losing_the_log_equals_the_model(tmp_path, any_url):
    model, source, committed = archive_rounds(tmp_path, any_url)
    shutil.rmtree(source)  # the machine is gone
    store = open_store(any_url)
    result = restore(store, str(tmp_path / "restored"))
    sequence, end, records = committed[-1]
    assert (result.sequence, result.end_offset) == (sequence, end)
    assert records_of(tmp_path / "restored") == records  # exactly the manifest's records
    assert state_of(tmp_path / "restored") == model.state(end)
    with compactlog.open(tmp_path / "restored") as log:  # opens without repair
        assert log.append(b"next", b"value") == end  # offsets continue
    assert verify(store).ok


def test_every_as_of_offset_restore_equals_the_model_then(tmp_path, s3_url):
    model, _source, committed = archive_rounds(tmp_path, s3_url, rounds=10, seed=2)
    store = open_store(s3_url)
    for i, (sequence, end, records) in enumerate(committed):
        target = tmp_path / f"as-of-{i}"
        result = restore(store, str(target), as_of_offset=end)
        assert result.sequence == sequence
        assert records_of(target) == records
        assert state_of(target) == model.state(end)
    # a point between manifests takes the newest at or before it
    _seq, first_end, _ = committed[0]
    result = restore(store, str(tmp_path / "between"), as_of_offset=committed[1][1] - 1)
    assert result.end_offset == first_end or result.end_offset < committed[1][1]


def test_as_of_time_picks_the_manifest_of_that_moment(tmp_path, memory_url):
    _model, _source, committed = archive_rounds(tmp_path, memory_url, rounds=6, seed=3)
    store = open_store(memory_url)
    chosen = manifests.load(store, committed[2][0])
    result = restore(store, str(tmp_path / "t"), as_of_time_ms=chosen.time_ms)
    assert result.sequence >= chosen.sequence
    assert manifests.load(store, result.sequence).time_ms <= chosen.time_ms


def test_archive_size_follows_the_compacted_log_with_retention_zero(tmp_path, s3_url):
    """100 keys rewritten many times: after compaction and prune --retention 0s the archive
    holds about what the local log holds, not the changelog."""
    source = tmp_path / "source"
    log = new_log(source, segment_bytes=16384)
    reader = compactlog.open(source, read_only=True)
    store = open_store(s3_url)
    archiver = Archiver(reader, store)
    archiver.start()
    shipped = 0
    for _ in range(10):
        for _ in range(20):
            log.append_batch([(b"k%03d" % i, os.urandom(60)) for i in range(100)])
        log.compact(force=True)
        shipped += archiver.push().bytes
        prune(store, 0, orphan_grace_ms=0)
    archiver.stop()
    reader.close()
    local = segment_bytes_of(source)
    log.close()
    archived = sum(i.size for i in store.list(manifests.OBJECT_PREFIX))
    assert shipped > 5 * local  # the changelog went up ...
    assert archived <= 1.1 * local + 4096  # ... but the archive is the compacted log


def test_retention_keeps_the_window_and_the_newest(tmp_path, memory_url):
    _model, _source, committed = archive_rounds(tmp_path, memory_url, rounds=8, seed=5)
    store = open_store(memory_url)
    times = [manifests.load(store, s).time_ms for s, _e, _r in committed]
    # a window reaching back to the 4th commit keeps the 3rd on (its successor is inside)
    result = prune(store, retention_ms=500, now=times[3] + 100, orphan_grace_ms=0)
    kept = manifests.sequences(store)
    assert kept == [s for s, _e, _r in committed[2:]]
    assert result.manifests_deleted == [s for s, _e, _r in committed[:2]]
    assert verify(store).ok  # nothing a kept manifest names was deleted
    prune(store, 0, orphan_grace_ms=0)
    assert manifests.sequences(store) == [committed[-1][0]]
    assert verify(store).ok


def test_prune_never_deletes_what_a_running_restore_reads(tmp_path, memory_url):
    _model, _source, committed = archive_rounds(tmp_path, memory_url, rounds=6, seed=6)
    store = open_store(memory_url)
    first, end, records = committed[0]
    pruned = []

    def plan(op, key):  # prune runs while the restore is half-way through its objects
        if op == "get" and key.startswith("objects/") and not pruned:
            pruned.append(prune(store, 0, orphan_grace_ms=0))
        return None

    restore(FaultyStore(store, plan), str(tmp_path / "old"), as_of_offset=end)
    assert pruned and first in pruned[0].kept_for_readers
    assert records_of(tmp_path / "old") == records
    prune(store, 0, orphan_grace_ms=0)  # the restore is done: now it goes
    assert first not in manifests.sequences(store)


def test_restore_refuses_a_non_empty_directory_and_resumes_its_own(tmp_path, s3_url):
    model, _source, committed = archive_rounds(tmp_path, s3_url, rounds=6, seed=7)
    store = open_store(s3_url)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "precious").write_text("x")
    with pytest.raises(RestoreTargetError, match="not empty"):
        restore(store, str(busy))
    assert (busy / "precious").read_text() == "x"

    objects = sum(len(s.objects) for s in manifests.latest(store).segments)
    assert objects > 3
    fail_late = fail_object_gets_after(2)

    target = tmp_path / "r"
    with pytest.raises(StoreError):
        restore(FaultyStore(store, fail_late), str(target), threads=1)
    with pytest.raises(compactlog.NotALogError):
        compactlog.open(target, create=False, read_only=True)  # no meta: not a log yet
    result = restore(store, str(target))
    assert result.reused_segments > 0
    assert state_of(target) == model.state(committed[-1][1])


def test_a_corrupted_or_missing_object_is_named(tmp_path, s3_url):
    archive_rounds(tmp_path, s3_url, rounds=4, seed=8)
    store = open_store(s3_url)
    newest = manifests.latest(store)
    damaged = newest.segments[0].objects[0].key
    data, _ = store.get(damaged)
    store.put(damaged, data[:-1] + bytes([data[-1] ^ 1]))
    report = verify(store)
    assert not report.ok and damaged in report.problems[0]
    with pytest.raises(ObjectCorruptError, match=damaged):
        restore(store, str(tmp_path / "r1"))
    store.delete(damaged)
    report = verify(store)
    assert any(damaged in p and "not found" in p for p in report.problems)
    with pytest.raises(ObjectMissingError, match=damaged):
        restore(store, str(tmp_path / "r2"))


def test_archiving_a_restored_log_starts_a_new_generation(tmp_path, memory_url):
    model, _source, committed = archive_rounds(tmp_path, memory_url, rounds=4, seed=9)
    store = open_store(memory_url)
    target = tmp_path / "restored"
    restore(store, str(target))
    first_generation = manifests.latest(store).generation
    rng = random.Random(10)
    with compactlog.open(target) as log:
        model.append(log, rng, 50)
        log.flush()
    with compactlog.open(target, read_only=True) as reader:
        archiver = Archiver(reader, store)
        archiver.start()
        result = archiver.push()
        archiver.stop()
    assert result.new_generation
    assert result.manifest.generation == first_generation + 1
    assert result.manifest.sequence == committed[-1][0] + 1  # never an overwrite
    again = restore(store, str(tmp_path / "again"))
    assert state_of(tmp_path / "again") == model.state(again.end_offset)


def test_follower_equals_the_source_at_its_offset(tmp_path, s3_url):
    rng = random.Random(11)
    source = tmp_path / "source"
    log = new_log(source)
    reader = compactlog.open(source, read_only=True)
    store = open_store(s3_url)
    archiver = Archiver(reader, store)
    archiver.start()
    model = Model()
    follower = Follower(store, str(tmp_path / "replica"))
    for round_ in range(8):
        model.append(log, rng, rng.choice((5, 80, 250)))
        if round_ % 3 == 2:
            log.compact(force=True)
        archiver.push()
        status = follower.step()
        assert status.end_offset == log.end_offset
        assert records_of(tmp_path / "replica") == records_of(source)
        assert state_of(tmp_path / "replica") == model.state()
    archiver.stop()
    reader.close()
    log.close()


def test_offsets_handed_out_but_not_archived_are_never_reused(tmp_path, memory_url):
    """sync="os": the active segment is not durable, so the archive ends below the offsets
    the lost machine handed out; the restored log holds the archived records and its next
    append comes after every offset ever handed out."""
    log = new_log(tmp_path / "source", sync="os", segment_bytes=2048)
    model = Model()
    model.append(log, random.Random(12), 300)
    store = open_store(memory_url)
    with compactlog.open(tmp_path / "source", read_only=True) as reader:
        archiver = Archiver(reader, store)
        archiver.start()
        archived = archiver.push().end_offset
        archiver.stop()
    handed_out = log.end_offset
    log.close()
    assert archived < handed_out  # the premise: unsynced records were not archived
    restore(store, str(tmp_path / "restored"))
    assert state_of(tmp_path / "restored") == model.state(archived)
    with compactlog.open(tmp_path / "restored") as restored:
        assert restored.append(b"next", b"value") == handed_out


def test_a_kept_segment_a_power_loss_damaged_is_fetched_again(tmp_path, memory_url):
    """Restore renames whole segments before its one fsync pass (step 5): a power loss may
    leave a renamed segment short or zeroed, and the resumed restore must fetch it again."""
    model, _source, committed = archive_rounds(tmp_path, memory_url, rounds=8, seed=11)
    store = open_store(memory_url)
    fail_late = fail_object_gets_after(2)

    target = tmp_path / "r"
    with pytest.raises(StoreError):
        restore(FaultyStore(store, fail_late), str(target), threads=1)
    kept = sorted(target.glob("*.log"))
    assert kept
    with open(kept[0], "r+b") as handle:  # what an unsynced file may hold after power loss
        size = handle.seek(0, 2)
        handle.seek(size // 2)
        handle.write(bytes(size - size // 2))
    if len(kept) > 1:
        os.truncate(kept[1], os.path.getsize(kept[1]) // 3)
    restore(store, str(target))
    assert state_of(target) == model.state(committed[-1][1])
    assert records_of(target) == committed[-1][2]


def test_restored_indexes_are_the_ones_recovery_builds(tmp_path, memory_url):
    """Restore writes closed segments' indexes while fetching (step 4) so that opening the
    restored log reads no segment again; they must be exactly what recovery would build."""
    _model, _source, _committed = archive_rounds(tmp_path, memory_url, rounds=8, seed=5)
    store = open_store(memory_url)
    restore(store, str(tmp_path / "r"))
    written = {p.name: p.read_bytes() for p in sorted((tmp_path / "r").glob("*.idx"))}
    segments = sorted((tmp_path / "r").glob("*.log"))
    assert len(written) >= len(segments) - 1 >= 1
    for name in written:
        (tmp_path / "r" / name).unlink()
    compactlog.open(tmp_path / "r").close()  # recovery rebuilds them
    rebuilt = {p.name: p.read_bytes() for p in sorted((tmp_path / "r").glob("*.idx"))}
    assert {n: rebuilt[n] for n in written} == written


def test_a_segment_cut_below_its_sync_point_is_refused_not_archived(tmp_path, memory_url):
    source = tmp_path / "source"
    with compactlog.open(source, segment_bytes=1 << 20) as log:  # (closed: durable whole)
        for start in range(0, 100, 10):
            log.append_batch([(b"k%d" % n, b"v" * 40) for n in range(start, start + 10)])
    segment = source / "00000000000000000000.log"
    cut = batch_positions(segment)[5][0]
    os.truncate(segment, cut)
    store = open_store(memory_url)
    damage = f"{segment.name}: at byte {cut}: .* were made durable"
    with pytest.raises(CorruptLogError, match=damage):
        push_once(str(source), store)
    stats = run(str(source), store, interval_s=0.01, retention_ms=None, max_rounds=1)
    assert stats.failures == 1 and re.search(damage, stats.last_error), stats.last_error
    assert manifests.latest(store) is None  # (nothing shortened was shipped)
