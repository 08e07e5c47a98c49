"""A table never serves a state its log does not hold (issue 24, part 3): deletes the
cleaner expired while a disk table was down or a follower was behind, a state directory
used with another log, a damaged LMDB file; and the tombstone horizon and log ids that
make these known (``table_identity.py``, ``log_identity.py``)."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest

import compactlog
from compactlog.compaction.cleaner import clean_log
from compactlog.engine.latest import latest_dict
from compactlog.errors import ForeignTableStateError, TableStateCorruptError
from compactlog.storage import filenames
from compactlog.storage.fsio import FileSystem
from compactlog.storage.state_files import read_cleaner_state, read_meta
from compactlog.table.table import Table
from compactlog.table.table_disk import DiskStore

EXPIRING = {
    "segment_bytes": 1024,
    "index_interval_bytes": 128,
    "delete_retention_ms": 0,  # a tombstone goes on the second pass that sees it
}


def _disk_state(path, state_dir, **options) -> tuple[dict, int]:
    """The state a disk table restores at ``state_dir``, and its rebuild count."""
    with Table(path, store="disk", state_dir=state_dir, follow=False, **options) as table:
        return dict(table), table.rebuilds


def _fill(log, tag: bytes, count: int = 12) -> None:
    """Records of other keys, enough to roll segments past what came before."""
    log.append_batch([(b"%s%d" % (tag, i), b"x" * 60) for i in range(count)])


def _expire_delete_of(log, key: bytes) -> int:
    """Delete ``key`` and have the cleaner remove its tombstone; returns its offset."""
    offset = log.append(key, None)
    _fill(log, b"f")
    log.compact(force=True)  # passes the tombstone
    _fill(log, b"g")
    log.compact(force=True)  # ... and removes it (delete_retention_ms=0)
    assert all(r.offset != offset for r in log.read()), "the tombstone is still there"
    return offset


# -- deletes the cleaner expired ------------------------------------------------------------


def test_a_delete_expired_while_a_disk_table_was_down_is_not_undone(tmp_path, caplog):
    state_dir = tmp_path / "state"
    with compactlog.open(tmp_path / "log", **EXPIRING) as log:
        log.append_batch([(b"user:%d" % i, b"v" * 40) for i in range(10)])
        assert _disk_state(log.path, state_dir)[0][b"user:3"] == b"v" * 40
        offset = _expire_delete_of(log, b"user:3")
        state, rebuilds = _disk_state(log.path, state_dir)
        assert b"user:3" not in state
        assert read_cleaner_state(log.path).tombstone_horizon > offset
        assert state == latest_dict(log)
        assert rebuilds == 1
        assert "removed expired tombstones" in caplog.text
        # the rebuilt state is past the horizon: the next start resumes
        assert _disk_state(log.path, state_dir) == (state, 0)


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_a_follower_behind_an_expired_delete_rebuilds(tmp_path, caplog, store):
    options = {} if store == "memory" else {"store": "disk", "state_dir": tmp_path / "state"}
    with compactlog.open(tmp_path / "log", **EXPIRING) as log:
        log.append_batch([(b"user:%d" % i, b"v" * 40) for i in range(10)])
        with log.table(follow=False, **options) as table:
            assert b"user:3" in table
            _expire_delete_of(log, b"user:3")
            table.refresh()
            assert b"user:3" not in table
            assert dict(table) == latest_dict(log)
            assert table.rebuilds == 1
    assert "removed expired tombstones" in caplog.text


def test_the_horizon_is_stored_before_the_swap_that_removes_a_tombstone(tmp_path):
    """Step 4a of the cleaner: a crash between the swap and the checkpoint must not leave
    a removed tombstone above the stored horizon."""
    with compactlog.open(tmp_path / "log", **EXPIRING) as log:
        log.append_batch([(b"k%d" % i, b"v" * 40) for i in range(10)])
        tombstone = log.append(b"k3", None)
        _fill(log, b"f")
        log.compact(force=True)
        _fill(log, b"g")
        start = log.start_offset

    seen = []

    class Watching(FileSystem):
        def rename(self, source, target):
            if source.endswith(filenames.REWRITE_SUFFIX):
                seen.append(read_cleaner_state(os.path.dirname(source)).horizon())
            super().rename(source, target)

    directory = str(tmp_path / "log")
    config = read_meta(directory).config
    stats = clean_log(directory, Watching(), config, now=1 << 50, log_start=start, force=True)
    assert stats.tombstones_removed == 1
    assert seen and seen[0] > tombstone  # (the first swapped group holds it)
    assert read_cleaner_state(directory).tombstone_horizon == seen[0]


def test_a_cleaner_checkpoint_without_a_horizon_stands_for_its_cleaner_point(tmp_path):
    """An older compactlog's ``cleaner.checkpoint`` (no ``tombstone_horizon``): a table
    below its cleaner point cannot know what was removed and rebuilds; one at or past it
    resumes; the next pass writes the field."""
    state_dir = tmp_path / "state"
    path = tmp_path / "log"
    with compactlog.open(path, **EXPIRING) as log:
        _fill(log, b"a", 30)
        _disk_state(path, state_dir)
        _fill(log, b"b", 30)
        log.compact(force=True)
    checkpoint = path / filenames.CLEANER_CHECKPOINT
    document = json.loads(checkpoint.read_bytes())
    del document["tombstone_horizon"]
    checkpoint.write_text(json.dumps(document))
    point = read_cleaner_state(str(path)).first_dirty_offset
    assert point > 30  # (the table's state is at 30)
    assert read_cleaner_state(str(path)).horizon() == point
    assert _disk_state(path, state_dir)[1] == 1  # cannot know: rebuilt
    assert _disk_state(path, state_dir)[1] == 0  # at the end now: resumed
    with compactlog.open(path) as log:
        log.compact(force=True)
    assert read_cleaner_state(str(path)).tombstone_horizon == point


# -- a state directory used with another log -----------------------------------------------


def test_one_state_directory_with_log_b_then_a_then_b(tmp_path, caplog):
    state_dir = tmp_path / "state"
    paths = {}
    for name in ("a", "b"):
        with compactlog.open(tmp_path / name) as log:
            log.append_batch([(b"%s%d" % (name.encode(), i), b"1") for i in range(20)])
            paths[name] = log.path
    expected = {name: latest_dict(compactlog.open(path)) for name, path in paths.items()}
    for name, rebuilds in (("b", 0), ("a", 1), ("b", 1)):
        state, count = _disk_state(paths[name], state_dir)
        assert state == expected[name], f"log {name} served another log's keys"
        assert count == rebuilds
    assert "built from another log" in caplog.text


def test_another_logs_state_can_be_refused(tmp_path):
    state_dir = tmp_path / "state"
    for name in ("a", "b"):
        with compactlog.open(tmp_path / name) as log:
            log.append(name.encode(), b"1")
    _disk_state(tmp_path / "a", state_dir, foreign_state="error")
    with pytest.raises(ForeignTableStateError, match="another log") as raised:
        _disk_state(tmp_path / "b", state_dir, foreign_state="error")
    assert str(state_dir) in str(raised.value)
    assert _disk_state(tmp_path / "a", state_dir, foreign_state="error") == ({b"a": b"1"}, 0)


def test_every_new_log_has_an_id_that_snapshot_and_repair_keep(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"k", b"v")
        log_id = read_meta(log.path).log_id
        assert log_id and len(log_id) == 32
        log.snapshot(str(tmp_path / "snap"))
    with compactlog.open(tmp_path / "other") as other:
        assert read_meta(other.path).log_id not in (None, log_id)
    assert read_meta(str(tmp_path / "snap")).log_id == log_id
    compactlog.repair(tmp_path / "log")
    assert read_meta(str(tmp_path / "log")).log_id == log_id


def test_a_log_made_before_ids_gets_one_without_a_settings_change(tmp_path):
    """Design invariant 8: adding the id rewrites no stored setting (not even a default the
    log never stored)."""
    path = tmp_path / "log"
    with compactlog.open(path, segment_bytes=4096) as log:
        log.append(b"k", b"v")
    meta = path / filenames.META
    document = json.loads(meta.read_bytes())
    del document["log_id"]
    del document["config"]["index_interval_bytes"]  # (stored by an older version: absent)
    meta.write_text(json.dumps(document))
    with compactlog.open(path, read_only=True):
        assert "log_id" not in json.loads(meta.read_bytes())  # a read-only open writes nothing
    with compactlog.open(path):
        pass
    after = json.loads(meta.read_bytes())
    log_id = after.pop("log_id")
    assert after == document and len(log_id) == 32
    with compactlog.open(path):
        pass
    assert json.loads(meta.read_bytes())["log_id"] == log_id


def test_a_disk_table_gives_an_old_log_an_id_and_rebuilds_an_old_state_once(tmp_path, caplog):
    path, state_dir = tmp_path / "log", tmp_path / "state"
    with compactlog.open(path) as log:
        log.append_batch([(b"k%d" % i, b"v") for i in range(10)])
    _disk_state(path, state_dir)
    meta = path / filenames.META
    document = json.loads(meta.read_bytes())
    del document["log_id"]
    meta.write_text(json.dumps(document))
    # a state of an older compactlog: no log id recorded
    store = DiskStore(str(state_dir))
    store.bind(None)
    store.commit(store.checkpoint())
    store.close()
    assert _disk_state(path, state_dir)[1] == 1
    assert "records no log id" in caplog.text
    assert read_meta(str(path)).log_id is not None
    assert _disk_state(path, state_dir) == ({b"k%d" % i: b"v" for i in range(10)}, 0)


# -- a damaged LMDB file -----------------------------------------------------------------


def _damage(state_dir, position: int, length: int) -> None:
    with open(os.path.join(state_dir, "data.mdb"), "r+b") as handle:
        handle.seek(position)
        handle.write(bytes(range(256)) * (length // 256))


@pytest.mark.parametrize(
    "where", ["meta pages", "data pages"], ids=["not-an-lmdb-file", "corrupted-pages"]
)
def test_a_damaged_state_is_named_and_rebuilt(tmp_path, caplog, where):
    path, state_dir = tmp_path / "log", tmp_path / "state"
    with compactlog.open(path) as log:
        log.append_batch([(b"key-%05d" % i, b"v" * 100) for i in range(3000)])
        expected = latest_dict(log)
    _disk_state(path, state_dir)
    if where == "meta pages":
        _damage(state_dir, 0, 8192)
    else:
        _damage(state_dir, 2 * 4096, 200 * 4096)
    with caplog.at_level(logging.WARNING, logger="compactlog.table"):
        state, rebuilds = _disk_state(path, state_dir)
    assert state == expected and rebuilds == 1
    assert f"{state_dir}: the table state is damaged" in caplog.text
    assert _disk_state(path, state_dir) == (expected, 0)


def test_damage_under_an_open_state_raises_an_error_naming_it(tmp_path):
    state_dir = str(tmp_path / "state")
    store = DiskStore(state_dir)
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"key-%05d" % i, b"v" * 100) for i in range(3000)])
        for batch in log.read_batches():
            store.apply(batch)
    store.commit(3000)
    try:
        _damage(state_dir, 2 * 4096, 200 * 4096)
        with pytest.raises(TableStateCorruptError, match="damaged") as raised:
            store.range_items(None, None, None)
        assert raised.value.path == state_dir
    finally:
        store.close()
    shutil.rmtree(state_dir)


def test_the_follower_rereads_the_horizon_once_a_second_whatever_stat_says(tmp_path):
    """Two writes of ``cleaner.checkpoint`` within one timestamp tick may show the same
    ``stat``: the watch reads it again after ``RECHECK_S`` and compares the horizon with
    the oldest offset polled since its last read."""
    from compactlog.storage.state_files import CleanerState, write_cleaner_state
    from compactlog.table.table_identity import RECHECK_S, HorizonWatch

    directory = str(tmp_path)
    fs = FileSystem()
    write_cleaner_state(fs, directory, CleanerState(100, [], 0))
    watch = HorizonWatch(directory)
    assert watch.missed(50, now=0.0) is None
    watch._seen = None  # (as if the next write's stat looked the same as this one)
    write_cleaner_state(fs, directory, CleanerState(100, [], 75))
    stat = os.stat(os.path.join(directory, filenames.CLEANER_CHECKPOINT))
    watch._seen = (stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size)
    assert watch.missed(70, now=0.5) is None  # (not read: stat unchanged, too soon)
    assert watch.missed(80, now=RECHECK_S + 0.1) == 75  # above 70, the oldest since the read
    assert watch.missed(90, now=RECHECK_S + 0.2) is None
