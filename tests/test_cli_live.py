"""The installed ``compactlog`` script beside live applications (issue 8, part 2).

A writer process appends without pause while the operator runs commands: compaction,
retention and subscriber changes succeed without ``--force`` and lose nothing the writer
was acknowledged for; only ``repair`` and ``config set`` of a setting writers read once at
open are refused, naming the writer's pid and the reason. A process that only reads (a
subscriber) is not a writer. A subscriber in use is refused for ``seek``/``remove`` naming
its consumer's pid, and freed at once when that consumer is ``kill -9``-ed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import compactlog

from .test_cli import one_error_line, run, run_json

WRITER = textwrap.dedent(
    """
    import os, sys, time, compactlog
    path, stop = sys.argv[1], sys.argv[2]
    with compactlog.open(path, sync="os") as log:
        n = 0
        while not os.path.exists(stop):
            log.append(b"key:%d" % (n % 40), b"%d" % n)
            n += 1
            if n % 20 == 0:
                log.flush()
            if n == 200:
                print("ready", flush=True)
            time.sleep(0.001)
        log.flush()
        print(n, flush=True)
    """
)

CONSUMER = textwrap.dedent(
    """
    import sys, time, compactlog
    path, name = sys.argv[1], sys.argv[2]
    log = compactlog.open(path, read_only=True)
    sub = log.subscribe(name)
    sub.poll(max_records=50)
    sub.commit()
    print(sub.position, flush=True)
    while True:
        sub.poll(max_records=10, timeout_s=0.05)
    """
)


@pytest.fixture
def writer(tmp_path):
    """A log being appended to by another process; yields ``(path, process, stop)``."""
    path = tmp_path / "log"
    with compactlog.open(path, segment_bytes=2048, min_cleanable_dirty_ratio=0.01, sync="os"):
        pass
    stop = tmp_path / "stop"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(stop)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    try:
        yield path, child, stop
    finally:
        stop.touch()
        child.wait(timeout=30)


def finish(child: subprocess.Popen, stop: Path) -> int:
    """Stop the writer; the number of records it was acknowledged for."""
    stop.touch()
    assert child.stdout is not None
    count = int(child.stdout.readline())
    assert child.wait(timeout=30) == 0
    return count


def start_consumer(path: Path, name: str) -> tuple[subprocess.Popen, int]:
    child = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, str(path), name], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    return child, int(child.stdout.readline())


def test_maintenance_and_subscriber_changes_run_beside_a_live_writer(writer):
    path, child, stop = writer
    end_before = run_json("meta", path)["end_offset"]
    compacted = run_json("compact", path)
    assert compacted["stats"]["bytes_read"] > 0
    run("retention", path)
    added = run_json("subscribers", "add", path, "audit", "--at", "start")
    assert added["committed"] == 0
    moved = run_json("subscribers", "seek", path, "audit", "--to", 100)
    assert moved["previous"] == 0 and moved["committed"] == 100
    run("subscribers", "remove", path, "audit")
    run("config", "set", path, "retention_ms=2d", "min_cleanable_dirty_ratio=0.2")
    assert run_json("meta", path)["end_offset"] > end_before  # it kept appending throughout
    acknowledged = finish(child, stop)
    with compactlog.open(path) as log:
        assert log.end_offset == acknowledged
        latest = {r.key: r.value for r in log.latest()}
        assert log.subscribers() == {}
        assert log.config.retention_ms == 2 * 86_400_000
    # every key's latest value is the last one the writer was acknowledged for
    expected = {b"key:%d" % (n % 40): b"%d" % n for n in range(acknowledged)}
    assert latest == expected
    run("verify", path)


def test_repair_and_writer_cached_config_are_refused_naming_the_writer_and_why(writer):
    path, child, _stop = writer
    line = one_error_line(run("repair", path, check=1))
    assert f"pid {child.pid}" in line and "repair truncates segments" in line, line
    for setting, reason in (
        ("segment_bytes=1MiB", "writers roll segments at the size they read"),
        ("sync=always", "sync policy"),
        ("max_record_bytes=1KiB", "a lowered limit would not stop them"),
        ("compression=zstd", "codec"),
    ):
        line = one_error_line(run("config", "set", path, setting, check=1))
        name = setting.split("=")[0]
        assert f"pid {child.pid}" in line and name in line and reason in line, line
        assert "--force" in line
    assert run_json("config", "get", path, "segment_bytes")["segment_bytes"] == 2048
    # a mix of safe and cached settings is refused as a whole: nothing is half applied
    one_error_line(run("config", "set", path, "retention_ms=1d", "segment_bytes=4KiB", check=1))
    assert run_json("config", "get", path, "retention_ms")["retention_ms"] != 86_400_000
    run("config", "set", path, "segment_bytes=4KiB", "--force")
    assert run_json("config", "get", path, "segment_bytes")["segment_bytes"] == 4096


def test_a_subscriber_process_is_not_a_writer(tmp_path):
    path = tmp_path / "log"
    with compactlog.open(path, sync="os") as log:
        log.append_batch([(b"k%d" % i, b"v") for i in range(100)])
    consumer, _position = start_consumer(path, "reader")
    try:
        assert run_json("meta", path)["writers"] == []
        run("config", "set", path, "segment_bytes=1MiB")  # no writer: not refused
        run("repair", path)
        listed = run_json("subscribers", "list", path)["subscribers"]
        assert [(s["name"], s["consumer_pid"]) for s in listed] == [("reader", consumer.pid)]
        assert f"pid {consumer.pid}" in run("subscribers", "list", path).stdout
    finally:
        consumer.kill()
        consumer.wait(timeout=10)


def test_seek_and_remove_refuse_a_subscriber_in_use_until_its_consumer_dies(writer):
    path, _writer, _stop = writer
    consumer, committed = start_consumer(path, "billing")
    try:
        assert committed == 50
        for args in (("seek", path, "billing", "--to", "start"), ("remove", path, "billing")):
            line = one_error_line(run("subscribers", *args, check=1))
            assert f"in use by pid {consumer.pid}" in line and "--force" in line, line
        assert run_json("subscribers", "list", path)["subscribers"][0]["committed"] == 50
        forced = run_json("subscribers", "seek", path, "billing", "--to", 10, "--force")
        assert forced["committed"] == 10
        # other names are not affected by one in use
        run("subscribers", "add", path, "other")
        run("subscribers", "seek", path, "other", "--to", "end")
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(timeout=10)
        # its lock died with it: the name can be changed at once, no --force
        assert run_json("subscribers", "seek", path, "billing", "--to", 20)["committed"] == 20
        assert run_json("subscribers", "list", path)["subscribers"][0]["consumer_pid"] is None
        run("subscribers", "remove", path, "billing")
        assert [s["name"] for s in run_json("subscribers", "list", path)["subscribers"]] == [
            "other"
        ]
        assert not os.path.exists(
            path / compactlog.storage.filenames.subscriber_lock_name("billing")
        )
    finally:
        if consumer.poll() is None:
            consumer.kill()
        consumer.wait(timeout=10)


def test_a_forced_remove_of_a_subscriber_in_use_leaves_its_consumer_working(tmp_path):
    path = tmp_path / "log"
    with compactlog.open(path, sync="os") as log:
        log.append_batch([(b"k%d" % i, b"v") for i in range(100)])
    consumer, _position = start_consumer(path, "billing")
    try:
        run("subscribers", "remove", path, "billing", "--force")
        assert run_json("subscribers", "list", path)["subscribers"] == []
        assert consumer.poll() is None  # still consuming; its next commit recreates it
        line = one_error_line(run("subscribers", "add", path, "billing", check=1))
        assert f"in use by pid {consumer.pid}" in line, line
    finally:
        consumer.kill()
        consumer.wait(timeout=10)
    assert json.loads(run("subscribers", "add", path, "billing", "--json").stdout)["committed"] == 0


CLOSED_BUT_KEPT = textwrap.dedent(
    """
    import sys, time, compactlog
    log = compactlog.open(sys.argv[1])
    sub = log.subscribe("kept")
    sub.poll(max_records=5)
    log.close()  # the subscriber object stays alive below
    print("closed", flush=True)
    time.sleep(600)
    """
)


def test_a_process_that_closed_its_log_but_kept_a_subscriber_holds_nothing(tmp_path):
    path = tmp_path / "log"
    with compactlog.open(path, sync="os") as log:
        log.append_batch([(b"k%d" % i, b"v") for i in range(20)])
    child = subprocess.Popen(
        [sys.executable, "-c", CLOSED_BUT_KEPT, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "closed"
        held = []
        for fd in os.listdir(f"/proc/{child.pid}/fd"):
            try:
                target = os.readlink(f"/proc/{child.pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(str(path) + os.sep):
                held.append(target)
        assert held == []
        assert run_json("meta", path)["writers"] == []
        run("subscribers", "seek", path, "kept", "--to", "end")  # the name is free
        run("repair", path)
    finally:
        child.kill()
        child.wait(timeout=10)
