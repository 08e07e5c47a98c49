"""The plain append path (``single.py``) and an exclusive writer's mapped tail
(``tailmap.py``): records stored into reserved room past the active segment's data, the
zeros that room leaves while the writer lives or after it was killed, and the fallbacks.
The kill -9 tests of the exclusive writer are in ``test_crash.py``."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.encoding.batch_encode import encode_single
from compactlog.encoding.format import read_batch_header
from compactlog.engine.single import PLAIN_MAX_BYTES
from compactlog.storage import filenames
from compactlog.storage.head import read_head_file
from compactlog.storage.tailmap import WINDOW_BYTES

from .helpers import batch_positions, run_python, segment_files


def head(log_dir):
    return read_head_file(str(log_dir / filenames.WRITER_LOCK), any_boot=True)  # (a hint)


def stored_batches(log_dir) -> list[bytes]:
    """Every stored batch's bytes, in order, as far as each segment's data goes."""
    found = []
    for path in segment_files(log_dir):
        data = path.read_bytes()
        found += [data[pos : pos + length] for pos, length in batch_positions(path)]
    return found


READ_KEYS = textwrap.dedent(
    """
    import sys
    import compactlog
    with compactlog.open(sys.argv[1], read_only=True) as log:
        print(",".join(r.key.decode() for r in log.read()))
    """
)


def test_an_exclusive_writer_stores_into_reserved_room_that_readers_do_not_see(log_dir):
    with compactlog.open(log_dir, exclusive=True) as log:
        for i in range(10):
            assert log.append(b"k%d" % i, b"v" * 100) == i
        assert log.plain_append_installed
        active = log.writer.active
        assert active.window is not None and active.reserved
        [segment] = segment_files(log_dir)
        data_end = head(log_dir).active_size
        assert os.path.getsize(segment) >= min(WINDOW_BYTES, log.config.segment_bytes)
        assert segment.read_bytes()[data_end:].count(0) == os.path.getsize(segment) - data_end
        # another process, and a read-only open here, read the ten records and stop there
        assert run_python(READ_KEYS, str(log_dir)).strip() == ",".join(f"k{i}" for i in range(10))
        with compactlog.open(log_dir, read_only=True) as reader:
            assert [r.offset for r in reader.read()] == list(range(10))
            assert sum(len(b) for b in reader.read_batches()) == 10
    # a clean close cuts the room off: the file ends with the data, and the next open
    # (which trusts the clean-shutdown marker only when the sizes agree) reports nothing
    assert os.path.getsize(segment) == head(log_dir).active_size == data_end
    with compactlog.open(log_dir) as log:
        assert log.recovery_report == []
        assert log.append(b"k10", b"v") == 10


def test_a_roll_cuts_the_room_off_the_segment_it_closes(log_dir):
    with compactlog.open(log_dir, exclusive=True, segment_bytes=8192) as log:
        for i in range(300):
            log.append(b"key%05d" % i, b"v" * 100)
        segments = segment_files(log_dir)
        assert len(segments) > 3
        for path in segments[:-1]:  # closed while the writer lives: data only
            positions = batch_positions(path)
            last_pos, last_length = positions[-1]
            assert os.path.getsize(path) == last_pos + last_length <= 8192
        with compactlog.open(log_dir, read_only=True) as reader:
            assert [r.offset for r in reader.read()] == list(range(300))


def test_the_room_never_passes_the_segment_size_limit(log_dir):
    with compactlog.open(log_dir, exclusive=True, segment_bytes=4096) as log:
        log.append(b"k", b"v")
        assert os.path.getsize(segment_files(log_dir)[-1]) <= 4096


KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    import compactlog
    log = compactlog.open(sys.argv[1], exclusive=True, sync="os")
    for i in range(int(sys.argv[2])):
        log.append(b"k%d" % i, b"v" * 50)
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_a_killed_exclusive_writers_room_is_truncated_quietly_by_the_next_writer(log_dir):
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(log_dir), "25"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    [segment] = segment_files(log_dir)
    data_end = head(log_dir).active_size
    assert os.path.getsize(segment) > data_end  # the room outlived its writer
    with compactlog.open(log_dir, read_only=True) as reader:  # no writer: readers stop at the zeros
        assert [r.key for r in reader.read()] == [b"k%d" % i for i in range(25)]
    with compactlog.open(log_dir) as log:
        assert not any("torn" in line for line in log.recovery_report), log.recovery_report
        assert os.path.getsize(segment) == data_end
        assert log.append(b"k25", b"v") == 25
    with compactlog.open(log_dir, read_only=True) as reader:
        assert [r.offset for r in reader.read()] == list(range(26))


def test_zeros_past_the_data_end_a_read_even_without_the_head(log_dir):
    """A reader that cannot read the head (here: no .lock at all, as in a copy of the
    files) meets the zeros where a batch should start and ends the read there."""
    with compactlog.open(log_dir, exclusive=True, sync="os") as log:
        for i in range(5):
            log.append(b"k%d" % i, b"v")
        [segment] = segment_files(log_dir)
        copy = log_dir.parent / "copy"
        copy.mkdir()
        for name in os.listdir(log_dir):
            if name.endswith((".log", ".idx")) or name == filenames.META:
                (copy / name).write_bytes((log_dir / name).read_bytes())
    assert os.path.getsize(copy / segment.name) > os.path.getsize(segment)
    with compactlog.open(copy, read_only=True) as reader:
        assert [r.offset for r in reader.read()] == list(range(5))


@pytest.mark.parametrize(
    ("error", "keeps_trying"), [(errno.EOPNOTSUPP, False), (errno.ENOSPC, True)]
)
def test_a_file_system_that_cannot_reserve_room_gets_pwrite(
    log_dir, monkeypatch, error, keeps_trying
):
    def refuse(fd: int, offset: int, length: int) -> None:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, "posix_fallocate", refuse)
    with compactlog.open(log_dir, exclusive=True, segment_bytes=4096) as log:
        for i in range(100):
            assert log.append(b"key%03d" % i, b"v" * 60) == i
        assert log.writer.active.window is None
        assert log.writer.map_tail is keeps_trying
        for path in segment_files(log_dir):
            positions = batch_positions(path)
            assert os.path.getsize(path) == positions[-1][0] + positions[-1][1]
    monkeypatch.undo()
    with compactlog.open(log_dir, read_only=True) as reader:
        assert [r.offset for r in reader.read()] == list(range(100))


def test_a_failed_write_drops_the_window_before_truncating(log_dir, monkeypatch):
    """The pwrite path of an exclusive writer (no window for now) failing: the segment is
    truncated back, so no map of room past the new end may survive (a store there would
    be a SIGBUS); the next checkpoint reserves and maps again."""
    import compactlog.engine.single as single

    with compactlog.open(log_dir, exclusive=True) as log:
        log.append(b"a", b"1")
        writer = log.writer
        active = writer.active
        assert active.window is not None
        active.drop_window()  # as after a refused reservation
        active.plain_stop = 0

        def failing_pwrite(fd: int, data: bytes, position: int) -> int:
            raise OSError(errno.EIO, "injected")

        monkeypatch.setattr(single, "pwrite", failing_pwrite)
        log._remove_plain_append()
        log._choose_append_path()  # rebuilt with the failing pwrite bound
        monkeypatch.setattr(writer, "_map_window", lambda active, need: None)
        with pytest.raises(compactlog.WriteRefusedError, match="injected"):
            log.append(b"b", b"2")
        assert active.window is None and not active.reserved
        monkeypatch.undo()
        log._choose_append_path()
        assert log.append(b"c", b"3") == 1
        assert active.window is not None
    with compactlog.open(log_dir, read_only=True) as reader:
        assert [(r.offset, r.key) for r in reader.read()] == [(0, b"a"), (1, b"c")]


# -- the plain path's encoder: byte for byte the one-record encoder --------------------------


@settings(max_examples=30, deadline=None)
@given(
    records=st.lists(
        st.tuples(st.binary(max_size=40), st.binary(max_size=PLAIN_MAX_BYTES - 40)),
        min_size=1,
        max_size=12,
    ),
    exclusive=st.booleans(),
)
def test_plain_appends_store_exactly_what_encode_single_encodes(
    tmp_path_factory, records, exclusive
):
    log_dir = tmp_path_factory.mktemp("plain")
    with compactlog.open(log_dir, exclusive=exclusive, segment_bytes=16384) as log:
        assert log.plain_append_installed
        offsets = [log.append(key, value) for key, value in records]
    assert offsets == list(range(len(records)))
    stored = stored_batches(log_dir)
    assert len(stored) == len(records)
    for offset, ((key, value), data) in enumerate(zip(records, stored, strict=True)):
        header, _ = read_batch_header(data, 0, len(data))
        assert header is not None and header.length == len(data)
        timestamp = int.from_bytes(data[28:36], "little")  # first_ts: the wall clock
        assert data == encode_single(key, value, timestamp, b"", offset)


def test_calls_that_are_not_plain_take_the_general_path_and_mix_in_order(log_dir):
    with compactlog.open(log_dir, exclusive=True) as log:
        log.append(b"a", b"1")
        log.append(b"b", None)  # a tombstone
        log.append(b"c", b"3", timestamp_ms=1234)
        log.append(b"d", b"4", headers={"h": b"x"})
        log.append(b"e", b"v" * (PLAIN_MAX_BYTES + 1))  # past the plain size
        log.append(bytearray(b"f"), b"6")
        log.append(b"g", b"7")
        log.append_batch([(b"h", b"8"), (b"i", b"9")])
        log.append(b"j", b"10")
        records = list(log.read())
    assert [r.key for r in records] == [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i", b"j"]
    assert [r.offset for r in records] == list(range(10))
    assert records[1].value is None
    assert records[2].timestamp == 1234
    assert records[3].headers == {"h": b"x"}


def test_the_installed_append_reads_like_log_append(log_dir):
    with compactlog.open(log_dir) as log:
        assert log.plain_append_installed
        assert log.append.__doc__ == compactlog.Log.append.__doc__
        assert log.append.__name__ == "append"
    assert not log.plain_append_installed  # closed: Log.append itself, which refuses
    with pytest.raises(compactlog.LogClosedError):
        log.append(b"k", b"v")


@pytest.mark.leaves_damage
def test_a_refresh_that_fails_lets_other_writers_go_on(log_dir):
    """A shared writer that takes the flock, finds another writer moved the log and fails
    to catch up (its active segment is gone) must release the flock, or every other
    writer of the log would block for good."""
    first = compactlog.open(log_dir)
    second = compactlog.open(log_dir)
    try:
        first.append(b"a", b"1")
        second.append(b"b", b"2")  # first's view is now stale
        for path in segment_files(log_dir):
            path.unlink()
        with pytest.raises(compactlog.MissingSegmentError):
            first.append(b"c", b"3")
        fd = os.open(log_dir / filenames.WRITER_LOCK, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # would raise while held
        finally:
            os.close(fd)
    finally:
        for log in (first, second):
            try:
                log.close()
            except compactlog.CompactLogError:
                pass


def test_the_figures_of_a_live_exclusive_writers_log_leave_the_room_out(log_dir):
    """`compactlog meta`, `segments`, retention and the subscribers' backlog count data,
    not the room an exclusive writer reserved past it."""
    import json

    from click.testing import CliRunner
    from compactlog.cli.main import cli

    with compactlog.open(log_dir, exclusive=True) as log:
        for i in range(20):
            log.append(b"k%d" % i, b"v" * 100)
        data_end = head(log_dir).active_size
        [segment] = segment_files(log_dir)
        assert os.path.getsize(segment) > data_end
        runner = CliRunner()
        meta = json.loads(runner.invoke(cli, ["meta", str(log_dir), "--json"]).output)
        assert meta["size_bytes"] == data_end - 16  # batch bytes: the segment header aside
        listed = json.loads(runner.invoke(cli, ["segments", str(log_dir), "--json"]).output)
        assert [row["size_bytes"] for row in listed["segments"]] == [data_end]
        with log.subscribe("reader") as subscriber:
            assert subscriber.lag_bytes == data_end - 16


def test_records_past_the_window_are_written_when_no_new_room_is_mapped(log_dir):
    """A writer that stops mapping room (here: told to; in life, a file system that
    refuses to reserve) drops the window it has once a record would pass its end."""
    with compactlog.open(log_dir, exclusive=True) as log:
        log.append(b"k", b"v")
        window = log.writer.active.window
        assert window is not None
        log.writer.map_tail = False
        count = (window.end - window.start) // 100 + 10  # records of 100 bytes and more
        for i in range(count):
            log.append(b"k%06d" % i, b"v" * 50)
        assert log.writer.active.window is None
        total = count + 1
    with compactlog.open(log_dir, read_only=True) as reader:
        assert sum(len(b) for b in reader.read_batches()) == total
