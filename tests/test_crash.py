"""Crash tests with real processes: ``kill -9`` a writer at random moments, then check that
every acknowledged record is present and intact, no torn data is visible, and the log
accepts appends again (design invariant 1)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import compactlog

from .helpers import check_record

CHILD = Path(__file__).parent / "children" / "appender.py"
KILLS = 25


def spawn(log_dir, writer, config, count=0, mode="mixed"):
    return subprocess.Popen(
        [
            sys.executable,
            str(CHILD),
            str(log_dir),
            str(writer),
            str(count),
            mode,
            json.dumps(config),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def parse_acks(lines):
    """(first offset, seq, n[, writer]) of every whole acknowledgement line (the writer id
    is given by children running several threads)."""
    acks = []
    for line in lines:
        parts = line.split()
        if len(parts) in (3, 4) and line.endswith(b"\n"):
            acks.append(tuple(map(int, parts)))
    return acks


def run_and_kill(log_dir, writer, config, rng, mode="mixed"):
    """Start a child, let it acknowledge a random number of appends, kill -9 it. Returns
    every acknowledgement it wrote before dying."""
    child = spawn(log_dir, writer, config, mode=mode)
    try:
        ready = child.stdout.readline()
        assert ready == b"ready\n", ready + child.stderr.read()
        target = rng.choice((0, 1, 2, 5, 10, 20, 40))
        lines = []
        while len(lines) < target:
            line = child.stdout.readline()
            assert line, child.stderr.read()
            lines.append(line)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        lines.extend(child.stdout.readlines())  # acknowledged before the kill
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    return parse_acks(lines)


def verify(log_dir, acked):
    """Open like a restarted application would and check every promise."""
    with compactlog.open(log_dir) as log:
        records = list(log.read())
        end = log.end_offset
    assert [r.offset for r in records] == list(range(end)), "offsets are not contiguous"
    seqs = defaultdict(list)
    for record in records:
        check_record(record)  # intact: the value matches the key
        writer, seq = record.key.decode().lstrip("w").split("-")
        seqs[int(writer)].append(int(seq))
    by_offset = {r.offset: r.key for r in records}
    for offset, key in acked.items():
        assert by_offset.get(offset) == key, f"acknowledged offset {offset} lost or changed"
    for writer, found in seqs.items():
        # one writer appends sequentially: what landed is a gap-free prefix in order
        assert found == list(range(len(found))), f"writer {writer} order broken"
    return end


def crash_loop(log_dir, config, seed, mode="mixed"):
    rng = random.Random(seed)
    acked: dict[int, bytes] = {}
    kills = 0
    for writer in range(KILLS):
        for first, seq, n, *thread in run_and_kill(log_dir, writer, config, rng, mode):
            for i in range(n):
                acked[first + i] = b"w%d-%d" % (thread[0] if thread else writer, seq + i)
        kills += 1
        verify(log_dir, acked)
    assert kills == KILLS
    assert len(acked) > KILLS  # the children did acknowledge work
    with compactlog.open(log_dir) as log:
        end = log.end_offset
        assert log.append(b"w999-0", b"") == end  # the log accepts appends again
        assert log.append_batch([(b"w999-1", b"")]) == range(end + 1, end + 2)
    return acked


def test_kill_9_of_a_sync_always_writer_loses_no_acknowledged_record(log_dir):
    config = {"sync": "always", "segment_bytes": 4096, "index_interval_bytes": 512}
    crash_loop(log_dir, config, seed=1)
    assert len(list(log_dir.glob("*.log"))) > 1  # the kills also hit segment rolls


def test_kill_9_of_a_precommit_writer_loses_no_acknowledged_record(log_dir):
    config = {
        "sync": "os",
        "precommit_bytes": 8192,
        "sync_interval_ms": 20,
        "segment_bytes": 8192,
    }
    crash_loop(log_dir, config, seed=2)
    assert (log_dir / "pre_commit").exists()


@pytest.mark.parametrize("segment_bytes", [4096, 1 << 20])
def test_kill_9_of_an_exclusive_writer_loses_no_acknowledged_record(log_dir, segment_bytes):
    """exclusive=True: records stored into the reserved, mapped room past the active
    segment's data (tailmap.py) and the head in the mmap; the lock goes with the killed
    process, so the next (non-exclusive) open truncates the room, recovers and writes.
    Small segments: the kills also hit rolls, which cut the room off the closed segment."""
    config = {
        "exclusive": True,
        "sync": "os",
        "segment_bytes": segment_bytes,
        "index_interval_bytes": 512,
    }
    crash_loop(log_dir, config, seed=3, mode="single")
    if segment_bytes == 4096:
        assert len(list(log_dir.glob("*.log"))) > 1


@pytest.mark.parametrize("exclusive", [False, True])
def test_kill_9_of_threads_appending_together_loses_no_acknowledged_record(log_dir, exclusive):
    """Three threads of single appends, whose records are written together when they meet
    at the lock (one pwritev for several records)."""
    config = {"exclusive": exclusive, "sync": "os", "segment_bytes": 4096}
    crash_loop(log_dir, config, seed=4 + exclusive, mode="threads")


def test_kill_9_of_a_lingering_writer_loses_only_unflushed_records(log_dir):
    """linger_ms is not crash-safe: a kill loses what was not flushed, nothing else, and
    never leaves a damaged log (the acknowledgements here come after flush())."""
    config = {"linger_ms": 50, "batch_records": 7, "sync": "os", "segment_bytes": 4096}
    acked = crash_loop(log_dir, config, seed=6, mode="linger")
    with compactlog.open(log_dir) as log:
        assert len(list(log.read())) >= len(acked)


@pytest.mark.parametrize("mode", ["single", "batch"])
def test_a_writer_that_finishes_acknowledges_everything(log_dir, mode):
    child = spawn(log_dir, 0, {"precommit_bytes": 4096, "sync": "os"}, count=200, mode=mode)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    lines = out.splitlines(keepends=True)
    assert lines[-1] == b"done\n"
    acked = {
        first + i: b"w0-%d" % (seq + i) for first, seq, n in parse_acks(lines) for i in range(n)
    }
    assert verify(log_dir, acked) == 200


def test_a_live_writer_appends_correctly_after_another_is_killed_mid_append(log_dir):
    """Heads are stores into the shared map, so a live writer learns of a writer killed
    halfway through an append only from the writing mark the dead one left set: after
    every kill, this process's long-open writer must validate the tail (cut what is torn,
    keep what is whole) and append at the true end, never over acknowledged records."""
    from .helpers import value_for

    config = {"sync": "os", "segment_bytes": 4096, "index_interval_bytes": 512}
    rng = random.Random(8)
    acked: dict[int, bytes] = {}
    with compactlog.open(log_dir, **config) as live:
        for writer in range(12):
            for first, seq, n, *_ in run_and_kill(log_dir, writer, config, rng, "single"):
                for i in range(n):
                    acked[first + i] = b"w%d-%d" % (writer, seq + i)
            for seq in range(3):
                key = b"w%d-%d" % (100 + writer, seq)
                offset = live.append(key, value_for(key))
                assert offset not in acked
                acked[offset] = key
            assert live.end_offset == max(acked) + 1
        verify(log_dir, acked)
    assert len(list(log_dir.glob("*.log"))) > 1
