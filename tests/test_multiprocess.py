"""Many processes on one log: concurrent appends land whole, exactly once, with consecutive
offsets and each writer's order kept; a second writer waits for the lock and works."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

import compactlog

from .helpers import run_python
from .test_crash import parse_acks, spawn, verify

WRITERS = 4
PER_WRITER = 600


@pytest.mark.parametrize(
    "config",
    [
        {"sync": "os", "segment_bytes": 8192},
        {"sync": "always", "segment_bytes": 1 << 20},
        {"sync": "os", "precommit_bytes": 4096, "sync_interval_ms": 5},
    ],
    ids=["os-small-segments", "always", "precommit"],
)
def test_four_processes_append_concurrently(log_dir, config):
    with compactlog.open(log_dir, **config):
        pass  # created once, so the children race only on appends
    children = [spawn(log_dir, w, config, count=PER_WRITER) for w in range(WRITERS)]
    outputs = [child.communicate(timeout=120) for child in children]
    acked = {}
    for writer, (child, (out, err)) in enumerate(zip(children, outputs, strict=True)):
        assert child.returncode == 0, err.decode()
        lines = out.splitlines(keepends=True)
        assert lines[0] == b"ready\n" and lines[-1] == b"done\n"
        previous = -1
        for first, seq, n in parse_acks(lines):
            assert first > previous  # each writer's offsets grow in its own order
            previous = first + n - 1
            for i in range(n):
                acked[first + i] = b"w%d-%d" % (writer, seq + i)
    assert len(acked) == WRITERS * PER_WRITER  # unique offsets: none handed out twice
    end = verify(log_dir, acked)  # contiguous, intact, every acknowledged record present
    assert end == WRITERS * PER_WRITER
    with compactlog.open(log_dir, read_only=True) as log:
        keys = [r.key for r in log.read()]
    assert len(set(keys)) == len(keys)  # exactly once


def test_threads_and_processes_append_together(log_dir):
    config = {"sync": "always", "segment_bytes": 4096}
    child = spawn(log_dir, 9, config, count=300)
    with compactlog.open(log_dir, **config) as log:

        def work(writer):
            for seq in range(150):
                key = b"w%d-%d" % (writer, seq)
                from .helpers import value_for

                log.append(key, value_for(key, 30))

        threads = [threading.Thread(target=work, args=(w,)) for w in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    _out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err.decode()
    assert verify(log_dir, {}) == 750


SECOND_WRITER = textwrap.dedent(
    """
    import sys
    import compactlog
    print("opening", flush=True)
    with compactlog.open(sys.argv[1]) as log:
        print(log.append(b"second", b"process"), flush=True)
    """
)


def test_a_second_writer_waits_for_the_lock_and_both_work(log_dir):
    with compactlog.open(log_dir) as log:
        log.append(b"first", b"process")
        with log.writer.pause_appends():  # a writer holds the lock (as precommit does)
            child = subprocess.Popen(
                [sys.executable, "-c", SECOND_WRITER, str(log_dir)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert child.stdout.readline() == b"opening\n"
            with pytest.raises(subprocess.TimeoutExpired):
                child.wait(timeout=0.3)  # blocked on the lock, not failed
        out, err = child.communicate(timeout=30)
        assert child.returncode == 0, err.decode()
        assert out == b"1\n"
        assert log.append(b"first", b"again") == 2
        assert [(r.key, r.value) for r in log.read()] == [
            (b"first", b"process"),
            (b"second", b"process"),
            (b"first", b"again"),
        ]


def test_a_writer_holding_precommit_entries_lets_a_second_writer_in(log_dir):
    with compactlog.open(log_dir, precommit_bytes=4096, sync="os", sync_interval_ms=10) as log:
        log.append(b"first", b"buffered")  # holds the lock until materialized
        child = subprocess.run(
            [sys.executable, "-c", SECOND_WRITER, str(log_dir)], capture_output=True, timeout=30
        )
        assert child.returncode == 0, child.stderr.decode()
        assert child.stdout == b"opening\n1\n"
        assert log.append(b"first", b"again") == 2
        log.flush()
        assert [r.key for r in log.read()] == [b"first", b"second", b"first"]


def test_a_reader_in_another_process_sees_flushed_records(log_dir):
    reader_script = textwrap.dedent(
        """
        import sys
        import compactlog
        with compactlog.open(sys.argv[1], read_only=True) as log:
            print(log.end_offset, [r.value.decode() for r in log.read()], flush=True)
        """
    )
    with compactlog.open(log_dir, precommit_bytes=4096, sync="os", sync_interval_ms=60_000) as log:
        log.append(b"k", b"flushed")
        log.flush()
        log.append(b"k", b"pending")  # in the precommit buffer: not visible yet

        def read():
            return run_python(reader_script, str(log_dir), timeout=30).strip()

        assert read() == "1 ['flushed']"
        log.flush()
        assert read() == "2 ['flushed', 'pending']"


OPEN_WITH_CONFIG = textwrap.dedent(
    """
    import sys
    import compactlog
    for round in range(5):
        retention_ms = int(sys.argv[2]) + round
        with compactlog.open(sys.argv[1], retention_ms=retention_ms, update_config=True) as log:
            log.append(b"k", sys.argv[2].encode())
    """
)


def test_processes_creating_and_reconfiguring_one_log_at_once_all_succeed(log_dir):
    """Regression: opens that merged config raced on one ``meta.tmp`` (FileNotFoundError)."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_WITH_CONFIG, str(log_dir), str(1000 * (i + 1))],
            stderr=subprocess.PIPE,
        )
        for i in range(WRITERS)
    ]
    errors = [child.communicate(timeout=60)[1] for child in children]
    assert [child.returncode for child in children] == [0] * WRITERS, b"".join(errors).decode()
    with compactlog.open(log_dir) as log:
        assert log.end_offset == 5 * WRITERS
        assert log.config.retention_ms in {1000 * (i + 1) + 4 for i in range(WRITERS)}
    assert not list(log_dir.glob("*.tmp"))
