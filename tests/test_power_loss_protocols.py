"""The protocol rules that make a power loss recoverable without ``repair``, one test each.

Every crash state here is built by hand from a real log: a copy of its directory taken while
the writer is open (what a ``kill -9`` leaves), then changed the way a power loss may change
it (unsynced bytes lost or out of order, an unsynced directory entry gone, ``.lock`` stale).
``tests/powerloss/`` checks every crash point of recorded workloads; these name the rules.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

import compactlog
from compactlog.encoding.format import INDEX_ENTRY
from compactlog.storage import filenames
from compactlog.storage.fsio import FileSystem
from compactlog.storage.head import (
    BOOT,
    HEAD,
    Head,
    decode_head,
    encode_head,
    read_log_head,
    read_sync_point,
    register_writer,
    release_writer,
)
from compactlog.storage.segment import HEADER_SIZE, list_segments, read_index

from .helpers import batch_positions


def crash_copy(log_dir, name="crashed"):
    """The directory as a ``kill -9`` right now would leave it (the writer stays open)."""
    target = log_dir.parent / name
    shutil.copytree(log_dir, target)
    return target


def set_head(directory, head: Head) -> None:
    with open(directory / filenames.WRITER_LOCK, "r+b") as handle:
        handle.write(encode_head(head))


def read_all(directory):
    with compactlog.open(directory, read_only=True) as log:
        return [(r.offset, r.key, r.value) for r in log.read()]


def records(n, start=0):
    return [(i, b"k%03d" % i, b"v%03d" % i + b"." * 30) for i in range(start, start + n)]


def append(log, rows):
    for _offset, key, value in rows:
        log.append(key, value)


def test_open_after_a_crash_does_not_trust_a_head_that_points_inside_a_batch(log_dir):
    with compactlog.open(log_dir, sync="always") as log:
        append(log, records(6))
        crashed = crash_copy(log_dir)
    positions = batch_positions(crashed / filenames.segment_name(0))
    head = decode_head((crashed / filenames.WRITER_LOCK).read_bytes()[: HEAD.size])
    # the head an earlier life of the log left on disk: it ends inside the last batch
    set_head(crashed, head._replace(active_size=positions[-1][0] + 7, end_offset=5))
    with compactlog.open(crashed) as log:
        assert log.end_offset == 6
        assert not any("torn" in line or "cut" in line for line in log.recovery_report)
    assert read_all(crashed) == records(6)


def test_a_stale_index_entry_is_checked_before_validation_starts_there(log_dir):
    with compactlog.open(log_dir, index_interval_bytes=64) as log:
        append(log, records(12))
        log.flush()
        crashed = crash_copy(log_dir)
    # an entry an older index left (index files are never fsynced): it points into the
    # middle of an early batch, which a scan from there would take for corruption
    position = batch_positions(crashed / filenames.segment_name(0))[1][0]
    path = crashed / filenames.index_name(0)
    data = path.read_bytes()
    path.write_bytes(data[:HEADER_SIZE] + INDEX_ENTRY.pack(1, position + 8))
    with compactlog.open(crashed) as log:
        assert log.end_offset == 12
        assert log.append(b"next", b"value") == 12
    assert read_all(crashed)[:12] == records(12)


def test_index_entries_past_a_zeroed_sector_are_ignored_by_readers(log_dir):
    with compactlog.open(log_dir, index_interval_bytes=64) as log:
        append(log, records(12))
        log.flush()
    path = log_dir / filenames.index_name(0)
    data = path.read_bytes()
    path.write_bytes(data[:24] + bytes(8) + data[32:])  # the second entry lost to zeros
    assert len(read_index(str(log_dir), 0)) == 1
    assert read_all(log_dir) == records(12)


@pytest.mark.parametrize("state", ["empty", "zeros", "zeros and data"])
def test_a_newest_segment_whose_creation_was_never_synced_is_empty(log_dir, state):
    with compactlog.open(log_dir, segment_bytes=1024, sync="os") as log:
        append(log, records(40))
        log.flush()
        before = len(list_segments(str(log_dir)))
        while len(list_segments(str(log_dir))) == before:  # roll, and write into the new one
            log.append(b"roll", b"x" * 30)
        end = log.end_offset
        crashed = crash_copy(log_dir)
    newest = crashed / filenames.segment_name(list_segments(str(crashed))[-1])
    size = newest.stat().st_size
    body = {"empty": b"", "zeros": bytes(size), "zeros and data": bytes(512)}[state]
    newest.write_bytes(body + newest.read_bytes()[len(body) :] if body else b"")
    synced = read_all(crashed)
    assert [r[0] for r in synced] == list(range(len(synced)))
    assert len(synced) >= 40
    with compactlog.open(crashed) as log:
        assert log.end_offset >= len(synced)
        assert log.end_offset <= end
        offset = log.append(b"after", b"the crash")
    assert read_all(crashed)[-1] == (offset, b"after", b"the crash")


def unsynced_tail_copy(log_dir):
    """A crash copy of a log whose records 0-3 were flushed and 4-9 never synced."""
    with compactlog.open(log_dir, sync="os") as log:
        append(log, records(4))
        log.flush()
        append(log, records(6, start=4))  # never synced
        return crash_copy(log_dir)


def lose_batch(segment, index):
    """Zero the ``index``-th batch of ``segment`` (it never reached the disk); returns its
    position."""
    start, length = batch_positions(segment)[index]
    data = bytearray(segment.read_bytes())
    data[start : start + length] = bytes(length)
    segment.write_bytes(bytes(data))
    return start


def test_a_hole_past_the_sync_point_is_cut_and_reported(log_dir, caplog):
    crashed = unsynced_tail_copy(log_dir)
    segment = crashed / filenames.segment_name(0)
    size = segment.stat().st_size
    start = lose_batch(segment, 6)  # offset 6 did not reach the disk; 7-9 did
    assert read_all(crashed) == records(6)  # a read-only open stops at the hole
    with caplog.at_level("WARNING", logger="compactlog"), compactlog.open(crashed) as log:
        report = log.recovery_report
        assert log.end_offset == 10  # offsets 6-9 were published: never handed out again
        assert log.append(b"after", b"x") == 10
    assert any(f"cut {size - start} bytes at byte {start}" in line for line in report)
    assert any("00000000000000000000.log" in r.getMessage() for r in caplog.records)
    assert read_all(crashed) == [*records(6), (10, b"after", b"x")]


def test_a_hole_before_the_sync_point_is_corruption(log_dir):
    with compactlog.open(log_dir, sync="os") as log:
        append(log, records(10))
        log.flush()
        crashed = crash_copy(log_dir)
    lose_batch(crashed / filenames.segment_name(0), 6)
    with pytest.raises(compactlog.CorruptLogError, match="valid data follows"):
        compactlog.open(crashed)
    with pytest.raises(compactlog.CorruptLogError):
        read_all(crashed)


def test_a_checkpoint_past_the_recovered_end_keeps_its_offsets_unused(log_dir):
    with compactlog.open(log_dir, sync="os") as log:
        append(log, records(4))
        log.flush()
        append(log, records(6, start=4))  # never synced
        sub = log.subscribe("s")
        assert len(sub.poll(max_records=100)) == 10
        sub.commit()  # durable, past records that are not
        crashed = crash_copy(log_dir)
    segment = crashed / filenames.segment_name(0)
    os.truncate(segment, batch_positions(segment)[4][0])  # the power loss took 4-9 back
    set_head(
        crashed, read_log_head(str(crashed), any_boot=True)._replace(end_offset=4, active_size=0)
    )
    with compactlog.open(crashed) as log:
        assert log.end_offset == 10
        assert log.subscribers() == {"s": 10}
        assert log.append(b"new", b"record") == 10
        assert [r.offset for r in log.subscribe("s").poll(max_records=10)] == [10]


def test_a_rolled_segment_that_was_never_synced_is_recreated_past_the_head(log_dir):
    with compactlog.open(log_dir, segment_bytes=1024, sync="os") as log:
        append(log, records(30))
        log.flush()
        bases = list_segments(str(log_dir))
        append(log, records(30, start=30))
        crashed = crash_copy(log_dir)
        end = log.end_offset
    newer = [b for b in list_segments(str(crashed)) if b > bases[-1]]
    assert newer
    for base in newer:  # their directory entries never reached the disk
        os.remove(crashed / filenames.segment_name(base))
        os.remove(crashed / filenames.index_name(base))
    with compactlog.open(crashed) as log:
        assert log.end_offset == end  # the head's end offset: never reused
        assert any("never synced" in line for line in log.recovery_report)
    got = read_all(crashed)
    assert got == records(len(got)) and len(got) >= 30


def test_a_missing_segment_that_held_synced_records_needs_repair(log_dir):
    with compactlog.open(log_dir, sync="always", segment_bytes=1024) as log:
        append(log, records(30))
        crashed = crash_copy(log_dir)
    point = read_sync_point(str(crashed))
    assert point is not None and point.size > HEADER_SIZE
    os.remove(crashed / filenames.segment_name(point.base))
    os.remove(crashed / filenames.index_name(point.base))
    with pytest.raises(compactlog.MissingSegmentError, match="synced"):
        compactlog.open(crashed)


class Recording(FileSystem):
    """Notes each sync and what the head in ``.lock`` said at that moment."""

    def __init__(self, directory) -> None:
        self.directory = str(directory)
        self.calls: list[tuple[str, object]] = []

    def _head_end(self):
        head = read_log_head(self.directory)
        return None if head is None else head.end_offset

    def fdatasync(self, fd):
        self.calls.append(("fdatasync", os.readlink(f"/proc/self/fd/{fd}"), self._head_end()))
        super().fdatasync(fd)

    def fsync_dir(self, directory):
        self.calls.append(("fsync_dir", directory, None))
        super().fsync_dir(directory)

    def rename(self, source, target):
        self.calls.append(("rename", os.path.basename(target), None))
        super().rename(source, target)

    def remove(self, path):
        self.calls.append(("remove", os.path.basename(path), None))
        super().remove(path)


def test_under_sync_always_a_record_is_published_only_after_its_fsync(log_dir):
    compactlog.open(log_dir).close()
    fs = Recording(log_dir)
    with compactlog.Log(log_dir, sync="always", _fs=fs) as log:
        for i in range(3):
            fs.calls.clear()
            offset = log.append(b"k", b"v%d" % i)
            segment_syncs = [c for c in fs.calls if c[1].endswith(".log")]
            assert segment_syncs and segment_syncs[0][2] == offset  # not yet published
            assert read_log_head(str(log_dir)).end_offset == offset + 1  # published after
        fs.calls.clear()
        log.append_batch([(b"a", b"1"), (b"b", b"2")])
        assert next(c[2] for c in fs.calls if c[1].endswith(".log")) == 3


def test_a_roll_syncs_the_segment_it_leaves_under_every_policy(log_dir):
    compactlog.open(log_dir, segment_bytes=1024).close()
    fs = Recording(log_dir)
    with compactlog.Log(log_dir, sync="os", _fs=fs) as log:
        while len(list_segments(str(log_dir))) < 2:
            log.append(b"k", b"v" * 40)
        synced = [os.path.basename(c[1]) for c in fs.calls if c[0] == "fdatasync"]
        assert filenames.segment_name(0) in synced


def test_a_new_log_directory_is_fsynced_into_its_parent(tmp_path):
    fs = Recording(tmp_path)
    target = tmp_path / "a" / "b"
    with compactlog.Log(target, _fs=fs):
        pass
    dirs = [c[1] for c in fs.calls if c[0] == "fsync_dir"]
    assert str(tmp_path) in dirs and str(tmp_path / "a") in dirs
    assert str(target) in dirs  # the first segment's entry


def test_min_free_bytes_zero_is_no_floor(log_dir):
    class Full(FileSystem):
        def free_bytes(self, directory):
            return 0

    with compactlog.Log(log_dir, min_free_bytes=0, _fs=Full()) as log:
        assert log.append(b"k", b"v") == 0
        assert log.append_batch([(b"a", b"b")]) == range(1, 2)


def test_a_swap_fsyncs_the_directory_before_the_intent_and_before_removals(log_dir):
    with compactlog.open(log_dir, segment_bytes=1024) as log:
        for i in range(200):
            log.append(b"k%d" % (i % 5), b"v" * 40)
    fs = Recording(log_dir)
    with compactlog.Log(log_dir, _fs=fs) as log:
        fs.calls.clear()
        log.compact(force=True)
    kinds = [(c[0], c[1] if c[0] != "fsync_dir" else "dir") for c in fs.calls]
    intent = kinds.index(("rename", "cleaner.swap"))
    assert ("fsync_dir", "dir") in kinds[:intent]

    def first(kind):
        return next(i for i, c in enumerate(kinds) if c[0] == kind and c[1].endswith(".log"))

    assert ("fsync_dir", "dir") in kinds[first("rename") : first("remove")]


@pytest.fixture
def reboot():
    """Calling it simulates a reboot: a boot id of its own until the test ends."""
    before = BOOT.id

    def simulate() -> None:
        BOOT.id = os.urandom(16)

    yield simulate
    BOOT.id = before


def test_after_a_reboot_readers_do_not_stop_at_a_stale_head(log_dir, reboot):
    with compactlog.open(log_dir, sync="always") as log:
        append(log, records(3))
        stale = (log_dir / filenames.WRITER_LOCK).read_bytes()[: HEAD.size]
        append(log, records(3, start=3))  # synced, but the head on disk is the older one
        crashed = crash_copy(log_dir)
    (crashed / filenames.WRITER_LOCK).write_bytes(
        stale + (crashed / filenames.WRITER_LOCK).read_bytes()[HEAD.size :]
    )
    reboot()
    with compactlog.open(crashed, read_only=True) as log:
        assert log.end_offset == 6
        assert [(r.offset, r.key, r.value) for r in log.read()] == records(6)
        assert [r.offset for r in log.subscribe("new").poll(max_records=10)] == list(range(6))


def stale_head_copy(log_dir):
    """A log whose records 0-5 were all synced, under this boot, with the head in ``.lock``
    from before records 3-5: unsynced data lost without a reboot (a FUSE daemon that died,
    an NFS server with async exports that restarted), after its writer was killed."""
    with compactlog.open(log_dir, sync="always") as log:
        append(log, records(3))
        stale = (log_dir / filenames.WRITER_LOCK).read_bytes()[: HEAD.size]
        append(log, records(3, start=3))
        crashed = crash_copy(log_dir)
    (crashed / filenames.WRITER_LOCK).write_bytes(
        stale + (crashed / filenames.WRITER_LOCK).read_bytes()[HEAD.size :]
    )
    return crashed


def test_without_a_live_writer_a_stale_head_bounds_no_reader_under_the_same_boot(log_dir):
    crashed = stale_head_copy(log_dir)
    with compactlog.open(crashed, read_only=True) as log:
        assert log.end_offset == 6
        assert [(r.offset, r.key, r.value) for r in log.read()] == records(6)
        assert [r.offset for r in log.subscribe("new").poll(max_records=10)] == list(range(6))
    assert read_all(crashed) == records(6)


def test_while_a_live_writer_stands_behind_the_head_it_bounds_readers(log_dir):
    crashed = stale_head_copy(log_dir)
    # a writer registered (a writable open of another process, here its lock alone): what
    # it has not published yet is not read
    held = register_writer(str(crashed), str(crashed / filenames.WRITERS_LOCK), exclusive=False)
    try:
        assert read_all(crashed) == records(3)
    finally:
        release_writer(held, exclusive=False)
    assert read_all(crashed) == records(6)


def test_after_a_clean_close_and_a_reboot_readers_trust_the_closed_head(log_dir, reboot):
    with compactlog.open(log_dir, sync="os") as log:
        append(log, records(5))
    reboot()
    with compactlog.open(log_dir, read_only=True) as log:
        assert read_log_head(str(log_dir)) is None  # stored under the boot before
        assert log.end_offset == 5  # the clean-shutdown marker vouches for it
        assert [(r.offset, r.key, r.value) for r in log.read()] == records(5)


def test_verify_calls_an_unsynced_hole_a_torn_tail_not_corruption(log_dir):
    import subprocess
    import sys

    crashed = unsynced_tail_copy(log_dir)
    lose_batch(crashed / filenames.segment_name(0), 6)
    done = subprocess.run(
        [sys.executable, "-m", "compactlog", "verify", str(crashed), "--json"],
        capture_output=True,
        text=True,
    )
    assert "torn_tail" in done.stdout and "corrupt_batch" not in done.stdout, done.stdout


def test_a_stale_clean_marker_does_not_hide_a_checkpoint_past_the_end(log_dir):
    """The clean-shutdown marker of an earlier close can come back after a power loss (its
    removal by the next open was never synced). Recovery that cuts the unsynced tail back to
    where the marker says must still keep the offsets a subscriber committed past."""
    with compactlog.open(log_dir, sync="os") as log:
        append(log, records(4))
    marker = (log_dir / filenames.CLEAN_SHUTDOWN).read_bytes()
    lock = (log_dir / filenames.WRITER_LOCK).read_bytes()
    with compactlog.open(log_dir, sync="os") as log:
        append(log, records(3, start=4))  # never synced
        sub = log.subscribe("s")
        assert len(sub.poll(max_records=100)) == 7
        sub.commit()  # durable, past records that are not
        crashed = crash_copy(log_dir)
    (crashed / filenames.CLEAN_SHUTDOWN).write_bytes(marker)  # the removal was lost
    (crashed / filenames.WRITER_LOCK).write_bytes(lock)  # and so was every later head
    segment = crashed / filenames.segment_name(0)
    start = batch_positions(segment)[4][0]
    data = bytearray(segment.read_bytes())
    data[start : start + 8] = bytes(8)  # offset 4 never reached the disk; 5 and 6 did
    segment.write_bytes(bytes(data))
    with compactlog.open(crashed) as log:
        assert log.end_offset == 7
        assert log.append(b"new", b"record") == 7


def test_the_cli_reads_a_stale_heads_log_to_its_data_end_under_the_same_boot(log_dir):
    """``segments`` and ``dump`` are built on the same view (the issue's case: the CLI
    showed the active segment with the records the stale head named, not those on disk)."""
    from .test_cli import run, run_json

    crashed = stale_head_copy(log_dir)
    [segment] = run_json("segments", crashed)["segments"]
    assert (segment["records"], segment["next_offset"]) == (6, 6)
    dumped = run("dump", crashed, "--json").stdout.splitlines()
    assert [json.loads(line)["offset"] for line in dumped] == list(range(6))


def test_while_a_writer_recovers_readers_do_not_trust_the_head_it_found(log_dir, monkeypatch):
    """A writer is registered before its open-time recovery has judged the head a dead
    writer left: until then no live writer stands behind that head."""
    from compactlog.engine import recovery

    crashed = stale_head_copy(log_dir)
    seen = []
    recover = recovery.recover_on_open

    def recover_and_look(log):
        seen.append(read_all(crashed))  # a reader in the middle of the writer's open
        return recover(log)

    monkeypatch.setattr(recovery, "recover_on_open", recover_and_look)
    with compactlog.open(crashed):
        pass
    assert seen == [records(6)]
