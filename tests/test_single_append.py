"""Single appends (issue 12): the one-record encoder, exclusive writers, threads writing
together, and the producer-side linger. The kill -9 tests of these paths are in
``test_crash.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.encoding.batch_encode import encode_batch, encode_single
from compactlog.encoding.format import CODEC_ZSTD, FILE_HEADER, encode_headers, read_batch_header
from compactlog.storage import filenames
from compactlog.storage.fsio import FileSystem
from compactlog.storage.head import PUBLISHED_SIZE, WRITING_MARK, read_head_file

from .helpers import FailingFS, batch_positions, run_python, segment_files

# -- the one-record encoder ----------------------------------------------------------------

maybe_bytes = st.none() | st.binary(max_size=64)
header_maps = st.none() | st.dictionaries(st.text(max_size=8), st.binary(max_size=16), max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    key=maybe_bytes,
    value=maybe_bytes,
    timestamp=st.integers(0, 2**63 - 1),
    headers=header_maps,
    base=st.integers(0, 2**62),
)
def test_encode_single_is_byte_for_byte_the_batch_encoder(key, value, timestamp, headers, base):
    block = encode_headers(headers) if headers else b""
    expected = encode_batch([key], [value], timestamp, headers=[headers]).to_bytes(base)
    assert encode_single(key, value, timestamp, block, base) == expected


def test_single_appends_read_back_exactly(log_dir):
    with compactlog.open(log_dir, cleanup_policy="delete") as log:
        assert log.append(b"k", b"v", timestamp_ms=5) == 0
        assert log.append(None, b"no key", timestamp_ms=6) == 1
        assert log.append(b"gone", None, timestamp_ms=7, headers={"h": b"1"}) == 2
        assert log.append(b"", b"", timestamp_ms=8) == 3
        got = [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in log.read()]
    assert got == [
        (0, b"k", b"v", 5, None),
        (1, None, b"no key", 6, None),
        (2, b"gone", None, 7, {"h": b"1"}),
        (3, b"", b"", 8, None),
    ]


def test_bad_headers_are_refused_and_write_nothing(log_dir):
    with compactlog.open(log_dir) as log:
        with pytest.raises(compactlog.InvalidRecordError, match="bad header"):
            log.append(b"k", b"v", headers={"h": "not bytes"})
        with pytest.raises(compactlog.InvalidRecordError, match="mapping"):
            log.append(b"k", b"v", headers=[("h", b"1")])
        assert log.end_offset == 0
        assert log.append(b"k", b"v") == 0


def test_the_writing_mark_is_cleared_by_every_published_head(log_dir):
    with compactlog.open(log_dir) as log:
        for i in range(5):
            log.append(b"k%d" % i, b"v")
            with open(log_dir / filenames.WRITER_LOCK, "rb") as handle:
                assert handle.read(PUBLISHED_SIZE)[WRITING_MARK] == 0
        assert read_head_file(str(log_dir / filenames.WRITER_LOCK)).end_offset == 5


def test_a_writing_mark_left_by_a_dead_writer_makes_the_next_append_validate_the_tail(log_dir):
    with compactlog.open(log_dir) as first, compactlog.open(log_dir) as second:
        first.append(b"a", b"1")
        second.append(b"b", b"2")  # second has seen the head; now "first dies mid-write":
        segment = log_dir / filenames.segment_name(0)
        with open(segment, "ab") as handle:
            handle.write(b"\x99" * 30)  # a torn batch ...
        with open(log_dir / filenames.WRITER_LOCK, "r+b") as handle:
            handle.seek(WRITING_MARK)
            handle.write(b"\x01")  # ... after the mark, before the head
        assert second.append(b"c", b"3") == 2
        assert second.writer.torn_bytes_dropped == 30
        assert [r.key for r in second.read()] == [b"a", b"b", b"c"]


# -- exclusive writers ---------------------------------------------------------------------

OPEN_WRITER = textwrap.dedent(
    """
    import sys
    import compactlog
    try:
        with compactlog.open(sys.argv[1], exclusive=sys.argv[2] == "1") as log:
            print("opened", log.append(b"child", b"x"), flush=True)
    except compactlog.LogLockedError as error:
        print("refused", error, flush=True)
    """
)


def other_writer(log_dir, exclusive=False):
    return run_python(OPEN_WRITER, str(log_dir), "1" if exclusive else "0")


def test_an_exclusive_writer_refuses_other_writers_naming_its_pid(log_dir):
    with compactlog.open(log_dir, exclusive=True) as log:
        log.append(b"a", b"1")
        answer = other_writer(log_dir)
        assert answer.startswith("refused") and f"pid {os.getpid()} exclusive" in answer
        assert other_writer(log_dir, exclusive=True).startswith("refused")
        with pytest.raises(compactlog.LogLockedError, match="exclusive"):
            compactlog.open(log_dir)  # in this process too
        assert log.append(b"b", b"2") == 1  # the holder goes on


@pytest.mark.parametrize(
    "command",
    [["compact"], ["repair", "--dry-run"], ["repair", "--force"], ["retention"]],
    ids=" ".join,
)
def test_operator_commands_beside_an_exclusive_writer_refuse_at_once_naming_its_pid(
    log_dir, command
):
    """An exclusive writer holds ``.lock`` for good: a cleaner or repair in another process
    is refused at once (exit 1) with the writer's pid and what to do, never left waiting."""
    from .test_cli import run

    with compactlog.open(log_dir, exclusive=True) as log:
        log.append(b"a", b"1")
        result = run(command[0], log_dir, *command[1:], check=1, timeout=30)
        assert log.append(b"b", b"2") == 1  # the writer goes on
    line = result.stderr.strip()
    assert line.startswith(f"compactlog: error: {log_dir}: "), line
    assert f"exclusive=True by another process (pid {os.getpid()} exclusive)" in line, line
    assert "log.compact()" in line, line


def test_the_library_repair_beside_an_exclusive_writer_refuses_at_once(log_dir):
    with compactlog.open(log_dir, exclusive=True):
        outcome = run_python(
            "import sys, compactlog\n"
            "try:\n"
            "    compactlog.repair(sys.argv[1], dry_run=True)\n"
            "except compactlog.LogLockedError as error:\n"
            "    print('refused', error)\n",
            str(log_dir),
        )
    assert outcome.startswith("refused") and f"pid {os.getpid()}" in outcome, outcome


def test_an_exclusive_open_is_refused_while_another_writer_has_the_log(log_dir):
    with compactlog.open(log_dir):
        answer = other_writer(log_dir, exclusive=True)
    assert answer.startswith("refused") and "only writer" in answer
    assert other_writer(log_dir, exclusive=True) == "opened 0\n"


def test_readers_and_subscribers_work_beside_an_exclusive_writer(log_dir):
    with compactlog.open(log_dir, exclusive=True) as log:
        log.append(b"a", b"1")
        with compactlog.open(log_dir, read_only=True) as reader:
            assert [r.key for r in reader.read()] == [b"a"]
            log.append(b"b", b"2")  # visible at once, without a flush
            assert [r.key for r in reader.read()] == [b"a", b"b"]
            assert reader.end_offset == 2
        subscriber = log.subscribe("s")
        assert [r.key for r in subscriber.poll()] == [b"a", b"b"]
        log.append(b"c", b"3")
        assert [r.key for r in subscriber.poll(timeout_s=30)] == [b"c"]
        subscriber.commit()
        log.compact(force=True)
        log.enforce_retention()


def test_the_exclusive_lock_is_released_on_close(log_dir):
    with compactlog.open(log_dir, exclusive=True) as log:
        log.append(b"a", b"1")
    assert other_writer(log_dir) == "opened 1\n"
    with compactlog.open(log_dir, exclusive=True) as log:
        assert log.append(b"b", b"2") == 2
    with compactlog.open(log_dir) as log:
        assert [r.key for r in log.read()] == [b"a", b"child", b"b"]


def test_the_exclusive_lock_goes_with_a_killed_process(log_dir):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, compactlog, time\n"
            "log = compactlog.open(sys.argv[1], exclusive=True)\n"
            "log.append(b'held', b'x')\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n",
            str(log_dir),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"ready\n"
        assert other_writer(log_dir).startswith("refused")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()
    assert other_writer(log_dir) == "opened 1\n"
    with compactlog.open(log_dir, exclusive=True) as log:
        assert [r.key for r in log.read()] == [b"held", b"child"]


def test_exclusive_is_for_writers(log_dir):
    compactlog.open(log_dir).close()
    with pytest.raises(compactlog.ConfigError, match="exclusive"):
        compactlog.open(log_dir, read_only=True, exclusive=True)


# -- threads writing together ---------------------------------------------------------------


@pytest.mark.parametrize("exclusive", [False, True])
def test_concurrent_single_appends_get_unique_offsets_in_each_threads_order(log_dir, exclusive):
    per_thread = 300
    results: dict[int, list[int]] = {}
    with compactlog.open(log_dir, exclusive=exclusive, segment_bytes=4096) as log:

        def work(thread: int) -> None:
            results[thread] = [
                log.append(b"t%d-%d" % (thread, i), b"v" * (i % 50)) for i in range(per_thread)
            ]

        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        records = {r.offset: r.key for r in log.read()}
    assert sorted(records) == list(range(6 * per_thread))
    for thread, offsets in results.items():
        assert offsets == sorted(offsets)
        assert [records[o] for o in offsets] == [b"t%d-%d" % (thread, i) for i in range(per_thread)]


def test_a_failed_group_write_fails_every_record_in_it_and_the_log_goes_on(log_dir):
    fs = FailingFS(5)  # EIO
    with compactlog.open(log_dir, _fs=fs) as log:
        log.append(b"a", b"1")
        queue = [[b"q%d" % i, b"v", 1, b"", None] for i in range(3)]
        fs.failures = 1
        with log.writer.lock:
            log.writer._write_queue_locked(queue)
        assert all(isinstance(slot[4], compactlog.WriteRefusedError) for slot in queue)
        assert log.append(b"b", b"2") == 1
        assert [r.key for r in log.read()] == [b"a", b"b"]


# -- linger -------------------------------------------------------------------------------


def test_lingering_records_are_written_as_one_batch_on_flush(log_dir):
    with compactlog.open(log_dir, linger_ms=60_000, batch_records=100) as log:
        offsets = [log.append(b"k%d" % i, b"v%d" % i) for i in range(10)]
        assert offsets == list(range(10))
        assert list(log.read()) == []  # invisible until flushed
        log.flush()
        batches = list(log.read_batches())
        assert [len(b) for b in batches] == [10]
        assert [r.key for r in log.read()] == [b"k%d" % i for i in range(10)]


def stored_batch_sizes(log_dir) -> list[int]:
    """Records per stored batch (``read_batches`` joins runs of small batches, so it cannot
    tell how the writer cut them)."""
    from compactlog.storage.segment import SegmentReader, list_segments

    bases = list_segments(str(log_dir))
    sizes = []
    for base in bases:
        with SegmentReader(str(log_dir), base, last_segment=base == bases[-1]) as reader:
            sizes += [len(batch) for batch in reader.batches(FILE_HEADER.size)]
    return sizes


def test_a_full_linger_buffer_is_written_at_once(log_dir):
    with compactlog.open(log_dir, linger_ms=60_000, batch_records=4) as log:
        for i in range(10):
            log.append(b"k%d" % i, b"v")
        assert stored_batch_sizes(log_dir) == [4, 4]
        assert [r.offset for r in log.read()] == list(range(8))
    with compactlog.open(log_dir) as log:  # close flushed the rest
        assert stored_batch_sizes(log_dir) == [4, 4, 2]
        assert [r.offset for r in log.read()] == list(range(10))


def test_the_linger_timer_writes_the_buffer(log_dir):
    with compactlog.open(log_dir, linger_ms=5) as log:
        log.append(b"k", b"v", headers={"h": b"1"})
        deadline = time.monotonic() + 30
        while log.end_offset == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert [(r.key, r.headers) for r in log.read()] == [(b"k", {"h": b"1"})]


def test_batches_and_maintenance_write_lingering_records_first(log_dir):
    with compactlog.open(log_dir, linger_ms=60_000) as log:
        log.append(b"a", b"1")
        assert log.append_batch([(b"b", b"2"), (b"c", b"3")]) == range(1, 3)
        log.append(b"d", b"4")
        log.enforce_retention()  # maintenance takes the writers' lock: lingering goes first
        assert [r.key for r in log.read()] == [b"a", b"b", b"c", b"d"]


def test_a_lingering_writer_holds_other_writers_off_until_it_flushes(log_dir):
    with compactlog.open(log_dir, linger_ms=60_000) as log:
        log.append(b"mine", b"1")
        child = subprocess.Popen(
            [sys.executable, "-c", OPEN_WRITER, str(log_dir), "0"], stdout=subprocess.PIPE
        )
        try:
            time.sleep(0.3)
            assert child.poll() is None  # waiting for the writers' lock
            log.flush()
            out, _ = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert out == b"opened 1\n"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"linger_ms": -1}, "linger_ms"),
        ({"linger_ms": 5, "precommit_bytes": 8192}, "set one of them"),
        ({"batch_records": 0}, "batch_records"),
        ({"linger_ms": "5"}, "linger_ms"),
    ],
)
def test_linger_settings_are_validated(log_dir, config, message):
    with pytest.raises(compactlog.ConfigError, match=message):
        compactlog.open(log_dir, **config)


def test_the_linger_timer_fsyncs_its_write_under_sync_always(log_dir):
    class CountingFS(FileSystem):
        syncs = 0

        def fdatasync(self, fd: int) -> None:
            CountingFS.syncs += 1
            super().fdatasync(fd)

    with compactlog.open(log_dir, _fs=CountingFS(), linger_ms=5, sync="always") as log:
        before = CountingFS.syncs
        log.append(b"k", b"v")
        deadline = time.monotonic() + 30
        while log.end_offset == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        # published only once synced (sync="always" publishes after the fsync)
        assert log.end_offset == 1 and CountingFS.syncs > before


# -- the head in the mmap and the subscribers' doorbell --------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    flags=st.integers(0, 2**32 - 1),
    base=st.integers(0, 2**62),
    end=st.integers(0, 2**62),
    size=st.integers(0, 2**62),
)
def test_the_head_packed_in_place_is_byte_for_byte_the_encoded_one(flags, base, end, size):
    """Both in-place forms: the whole head, and an append's end offset and size only (over
    a head of the same flags and base)."""
    from compactlog.storage.head import (
        decode_head,
        encode_published,
        publish_end_into,
        publish_into,
    )

    buffer = bytearray(b"\xff" * PUBLISHED_SIZE)
    buffer[WRITING_MARK] = 0
    fields = memoryview(buffer)[:32]
    publish_into(buffer, fields, flags, base, end, size)
    assert bytes(buffer) == encode_published(flags, base, end, size)
    assert decode_head(bytes(buffer)) == (flags, base, end, size)
    publish_into(buffer, fields, flags, base, 1, 2)
    publish_end_into(buffer, fields, end, size)
    assert bytes(buffer) == encode_published(flags, base, end, size)


class LockWritesFS(FileSystem):
    """Counts the pwrites that reach ``.lock`` (the doorbell's rings)."""

    def __init__(self) -> None:
        self.lock_writes = 0
        self.lock_fds: set[int] = set()

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        fd = super().open(path, flags, mode)
        if os.path.basename(path) == filenames.WRITER_LOCK:
            self.lock_fds.add(fd)
        return fd

    def pwrite(self, fd, data, position):
        if fd in self.lock_fds:
            self.lock_writes += 1
        return super().pwrite(fd, data, position)


def ring_doorbell(log_dir) -> None:
    from compactlog.storage.head import DOORBELL

    with open(log_dir / filenames.WRITER_LOCK, "r+b") as handle:
        handle.seek(DOORBELL)
        handle.write(b"\x01")


def doorbell_of(log_dir) -> int:
    from compactlog.storage.head import DOORBELL

    with open(log_dir / filenames.WRITER_LOCK, "rb") as handle:
        return handle.read(DOORBELL + 1)[DOORBELL]


@pytest.mark.parametrize("exclusive", [False, True])
def test_appends_write_the_head_to_lock_only_when_the_doorbell_rang(log_dir, exclusive):
    fs = LockWritesFS()
    with compactlog.open(log_dir, _fs=fs, exclusive=exclusive) as log:
        log.append(b"warm", b"up")
        before = fs.lock_writes
        for i in range(20):
            log.append(b"k%d" % i, b"v")
        assert fs.lock_writes == before  # the head went into the mmap only
        assert read_head_file(str(log_dir / filenames.WRITER_LOCK)).end_offset == 21
        ring_doorbell(log_dir)
        log.append(b"rung", b"v")
        assert fs.lock_writes == before + 1  # answered with one pwrite ...
        assert doorbell_of(log_dir) == 0  # ... that cleared it
        log.append(b"quiet", b"v")
        assert fs.lock_writes == before + 1
        assert read_head_file(str(log_dir / filenames.WRITER_LOCK)).end_offset == 23


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_waiting_subscriber_is_woken_by_inotify_not_by_its_safety_timer(log_dir, exclusive):
    """The subscriber rings before it sleeps; the writer's answer is an inotify event, so
    the watcher stays on inotify (it falls back to sleeping after head moves it finds
    without one) and the poll returns long before its 50 ms safety re-check."""
    writer_code = textwrap.dedent(
        f"""
        import os, sys, time, compactlog
        from compactlog.storage.head import DOORBELL
        log = compactlog.open(sys.argv[1], exclusive={exclusive})
        # pread, not a buffered file: seek(0) inside a BufferedReader's buffer re-reads
        # nothing, so a doorbell set after the first read was never seen (a flaky test)
        lock = os.open(sys.argv[1] + "/.lock", os.O_RDONLY)
        for i in range(5):
            deadline = time.monotonic() + 10
            while not os.pread(lock, 1, DOORBELL)[0]:  # wait for a sleeper
                time.sleep(0.001)
                assert time.monotonic() < deadline
            time.sleep(0.02)  # the subscriber is in select() by now
            log.append(b"k%d" % i, b"v")
        os.close(lock)
        log.close()
        """
    )
    with compactlog.open(log_dir) as log:
        log.append(b"first", b"v")
    reader = compactlog.open(log_dir, read_only=True)
    subscriber = reader.subscribe("s", start=1)
    try:
        process = subprocess.Popen([sys.executable, "-c", writer_code, str(log_dir)])
        got, missed = [], []
        while len(got) < 5:
            records = subscriber.poll(timeout_s=10)
            assert records, "no record within 10 s"
            got.extend(r.key for r in records)
            watcher = subscriber._fds.watcher
            assert watcher is not None and watcher.fd >= 0
            missed.append(watcher.missed)  # 1 when the safety re-check found the record
        assert process.wait(timeout=30) == 0
        assert missed == [0] * len(missed) and watcher.reliable
        assert got == [b"k%d" % i for i in range(5)]
    finally:
        subscriber.close()
        reader.close()


def test_a_failed_ring_does_not_fail_the_append(log_dir):
    """The record is written and its head published before the ring: the append succeeds
    (a retry would duplicate it) and readers see the record."""

    class FailingRing(LockWritesFS):
        def pwrite(self, fd, data, position):
            if fd in self.lock_fds:
                raise OSError(5, "injected")
            return super().pwrite(fd, data, position)

    with compactlog.open(log_dir, _fs=FailingRing()) as log:
        log.append(b"a", b"1")
        ring_doorbell(log_dir)
        assert log.append(b"b", b"2") == 1
        assert doorbell_of(log_dir) == 0
        assert [r.key for r in log.read()] == [b"a", b"b"]
        assert log.end_offset == 2


# -- the plain path: Log.append straight to the writer's append_record -----------------------

READ_HEAD_AND_RECORDS = textwrap.dedent(
    """
    import sys
    import compactlog
    from compactlog.storage.head import read_head_file
    head = read_head_file(sys.argv[1] + "/.lock")
    with compactlog.open(sys.argv[1], read_only=True) as log:
        keys = [r.key.decode() for r in log.read()]
    print(head.end_offset, ",".join(keys))
    """
)


def seen_by_another_process(log_dir) -> str:
    return run_python(READ_HEAD_AND_RECORDS, str(log_dir)).strip()


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_plain_append_is_seen_by_another_process_when_it_returns(log_dir, exclusive):
    """No flush: the head stored into the map of .lock and the record's pwrite are all
    another process's reader needs, for the steady exclusive writer too."""
    with compactlog.open(log_dir, exclusive=exclusive) as log:
        assert log.plain_append_installed
        if exclusive:
            assert log.writer.steady
        assert [log.append(b"k%d" % i, b"v") for i in range(3)] == [0, 1, 2]
        assert seen_by_another_process(log_dir) == "3 k0,k1,k2"
        assert log.append(b"k3", b"v") == 3
        assert seen_by_another_process(log_dir) == "4 k0,k1,k2,k3"


@pytest.mark.parametrize("exclusive", [False, True])
def test_the_plain_path_refuses_bad_input_and_writes_nothing(log_dir, exclusive):
    with compactlog.open(log_dir, exclusive=exclusive, max_record_bytes=100) as log:
        log.append(b"k", b"v")
        with pytest.raises(compactlog.InvalidRecordError, match="key must be bytes"):
            log.append("k", b"v")
        with pytest.raises(compactlog.InvalidRecordError, match="value must be bytes"):
            log.append(b"k", 5)
        with pytest.raises(compactlog.InvalidRecordError, match="None is not allowed"):
            log.append(None, b"v")
        with pytest.raises(compactlog.RecordTooLargeError, match="max_record_bytes=100"):
            log.append(b"k" * 50, b"v" * 51)
        assert log.append(b"k" * 50, b"v" * 50) == 1  # the limit itself is allowed
        assert log.end_offset == 2
    with pytest.raises(compactlog.LogClosedError):
        log.append(b"k", b"v")
    with compactlog.open(log_dir, read_only=True) as reader:
        assert [r.offset for r in reader.read()] == [0, 1]


def test_the_plain_path_follows_config_changes(log_dir):
    """The path and its size limit are chosen with the config: a change another open made
    is honoured once this open reloads meta (here: a lower limit, then compression)."""
    with compactlog.open(log_dir) as log:
        log.append(b"k", b"v" * 200)
        with compactlog.open(log_dir) as other:  # as `config set --force` does
            other.store_config({"max_record_bytes": 100})
        log.reload_meta()
        with pytest.raises(compactlog.RecordTooLargeError):
            log.append(b"k", b"v" * 200)
        with compactlog.open(log_dir) as other:
            other.store_config({"compression": "zstd"})
        log.reload_meta()
        assert not log.plain_append_installed
        assert log.append(b"k", b"v" * 50) == 1
    last_segment = segment_files(log_dir)[-1]
    position, _length = batch_positions(last_segment)[-1]
    data = last_segment.read_bytes()
    header, _ = read_batch_header(data, position, len(data))
    assert header.codec == CODEC_ZSTD  # the record went through the columns encoder


@pytest.mark.parametrize("exclusive", [False, True])
def test_plain_appends_roll_segments_and_write_index_entries(log_dir, exclusive):
    from compactlog.storage.segment import read_index

    with compactlog.open(
        log_dir, exclusive=exclusive, segment_bytes=4096, index_interval_bytes=512
    ) as log:
        for i in range(200):
            assert log.append(b"key%05d" % i, b"v" * 100) == i
        bases = log.get_segments()
        assert len(bases) > 4
        for base in bases[:-1]:  # the closed ones: about 4,000 bytes, an entry per 512
            assert 3000 < (log_dir / filenames.segment_name(base)).stat().st_size <= 4096
            entries = read_index(str(log_dir), base)
            assert entries is not None and len(entries) >= 4
        assert [r.offset for r in log.read()] == list(range(200))


@pytest.mark.parametrize("exclusive", [False, True])
def test_plain_appends_roll_segments_at_segment_ms(log_dir, exclusive):
    with compactlog.open(log_dir, exclusive=exclusive, segment_ms=20) as log:
        log.append(b"a", b"1")
        log.append(b"b", b"2")
        time.sleep(0.05)
        log.append(b"c", b"3")
        assert log.get_segments() == [0, 2]


def test_a_steady_exclusive_writer_stops_after_a_failed_fsync(log_dir, monkeypatch):
    from compactlog.storage.fsio import DEFAULT_FS

    log = compactlog.open(log_dir, exclusive=True, sync="os")
    log.append(b"k", b"v")
    assert log.writer.steady

    def failing_fdatasync(fd: int) -> None:
        raise OSError(5, "injected")

    monkeypatch.setattr(DEFAULT_FS, "fdatasync", failing_fdatasync)
    with pytest.raises(compactlog.WriteRefusedError, match="fsync failed"):
        log.flush()
    assert not log.writer.steady
    with pytest.raises(compactlog.WriteRefusedError, match="reopened"):
        log.append(b"k", b"v")
    monkeypatch.undo()
    assert log.end_offset == 1
    with pytest.raises(compactlog.WriteRefusedError):
        log.close()
    with compactlog.open(log_dir, exclusive=True) as reopened:
        assert reopened.append(b"k2", b"v") == 1


def test_the_one_record_encoder_is_exact_for_large_records_too():
    key, value = b"k" * 3000, bytes(range(256)) * 20  # over the joined-CRC size
    expected = encode_batch([key], [value], 7).to_bytes(9)
    assert encode_single(key, value, 7, b"", 9) == expected
