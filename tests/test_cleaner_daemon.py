"""The real service as a subprocess, on temporary roots with a fast schedule, while other
processes keep the logs open and append.

It finds the logs, compacts the dirty ones (checked against a latest-value model), leaves
clean ones alone, picks up a log created while it runs, serves metrics the test scrapes,
isolates a corrupt log (and cleans it again after ``repair``), refuses a second instance on
the same root, stops on SIGTERM (idle and mid-pass, logs still correct) and starts cleanly
after ``kill -9`` mid-pass. No timing is asserted: waits have generous deadlines only so a
broken service fails instead of hanging.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from compactlog.cleaner.state import read_state

import compactlog

from .helpers import batch_positions, flip_bit, segment_files

WAIT = 60.0  # seconds a condition may take on a loaded 2-core machine before we give up

WRITER = textwrap.dedent(
    """
    import json, signal, sys, time
    import compactlog

    path, keys, config = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    log = compactlog.open(path, **config)
    print("ready", flush=True)
    seq = 0
    while not stop:
        for _ in range(10):
            key = b"k%d" % (seq % keys)
            log.append(key, b"%s:%d:" % (key, seq) + b"x" * 80)
            seq += 1
        log.flush()
        print(seq, flush=True)  # every record below seq is acknowledged
        time.sleep(0.005)
    log.close()
    print("done", seq, flush=True)
    """
)

SMALL = {"segment_bytes": 2048, "sync": "os"}


def model(keys: int, count: int) -> dict[bytes, bytes]:
    """The latest value of every key after ``count`` appends of the writer's pattern."""
    latest = {}
    for seq in range(max(0, count - keys), count):
        key = b"k%d" % (seq % keys)
        latest[key] = b"%s:%d:" % (key, seq) + b"x" * 80
    return latest


def latest_in(path: Path) -> tuple[dict[bytes, bytes], int]:
    """The latest value per key in the log, and how many records it still holds."""
    latest: dict[bytes, bytes] = {}
    count = 0
    previous = -1
    with compactlog.open(path, read_only=True) as log:
        for record in log.read():
            assert record.offset > previous  # order and offsets intact
            previous = record.offset
            latest[record.key] = record.value
            count += 1
    return latest, count


class Writer:
    """A process that keeps a log open and appends until SIGTERM."""

    def __init__(self, path: Path, keys: int = 20, config: dict[str, Any] | None = None) -> None:
        self.keys = keys
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(keys), json.dumps(config or SMALL)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"

    def stop(self) -> int:
        """Stop appending and close the log; returns how many records it appended."""
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=WAIT)
        assert self.proc.returncode == 0, err
        last = out.strip().splitlines()[-1].split()
        assert last[0] == "done"
        return int(last[1])


class Daemon:
    """``python -m compactlog.cleaner`` with its JSON log lines collected in a file."""

    def __init__(self, tmp: Path, *args: str, name: str = "daemon") -> None:
        self.err_path = tmp / f"{name}.{time.monotonic_ns()}.log"
        self.err = open(self.err_path, "w")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "compactlog.cleaner", "--log-format", "json", *args],
            stdout=subprocess.DEVNULL,
            stderr=self.err,
        )

    def events(self) -> list[dict[str, Any]]:
        lines = self.err_path.read_text().splitlines()
        found = []
        for line in lines:
            try:
                found.append(json.loads(line))
            except ValueError:
                continue  # a line still being written
        return found

    def wait_event(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        return wait_for(
            lambda: next((e for e in self.events() if predicate(e)), None),
            lambda: f"event not seen; service log:\n{self.err_path.read_text()[-3000:]}",
            proc=self.proc,
        )

    def wait(self, timeout: float = WAIT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.err.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()


def wait_for(
    check: Callable[[], Any],
    describe: Callable[[], str] | str = "condition",
    *,
    proc: subprocess.Popen[Any] | None = None,
) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            value = check()
            if value:
                return value
            pytest.fail(f"service exited ({proc.returncode}) first: " + _text(describe))
        time.sleep(0.05)
    pytest.fail("timed out: " + _text(describe))


def _text(describe: Callable[[], str] | str) -> str:
    return describe() if callable(describe) else describe


def state(root: Path) -> dict[str, Any]:
    try:
        return read_state(str(root / ".compactlog-cleaner.json"))
    except (FileNotFoundError, ValueError):
        return {}


def pass_status(root: Path, name: str) -> str | None:
    entry = state(root).get("logs", {}).get(str(root / name)) or {}
    return (entry.get("last_pass") or {}).get("status")


def fast(root: Path, *extra: str) -> list[str]:
    return [
        "--root",
        str(root),
        "--interval",
        "0.3",
        "--metrics-port",
        "0",
        "--grace",
        "10",
        *extra,
    ]


def scrape(root: Path, path: str = "/metrics") -> str:
    metrics = wait_for(lambda: state(root).get("metrics"), "metrics address in the state file")
    url = f"http://{metrics['address']}:{metrics['port']}{path}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def uncleanable_gauge(root: Path, name: str) -> str:
    """The value of ``compactlog_cleaner_log_uncleanable`` for one log, as scraped."""
    prefix = f'compactlog_cleaner_log_uncleanable{{log="{name}"'
    return next(x for x in scrape(root).splitlines() if x.startswith(prefix)).rsplit(" ", 1)[1]


def fill(path: Path, records: int, keys: int = 20, **config: Any) -> None:
    """A log with ``records`` updates of ``keys`` keys (the writer's pattern), closed."""
    with compactlog.open(path, **{**SMALL, **config}) as log:
        for start in range(0, records, 50):
            log.append_batch(
                [
                    (b"k%d" % (s % keys), b"%s:%d:" % (b"k%d" % (s % keys), s) + b"x" * 80)
                    for s in range(start, min(records, start + 50))
                ]
            )


# -- the tests ------------------------------------------------------------------------------


def test_compacts_dirty_logs_while_writers_append_and_leaves_clean_ones_alone(tmp_path):
    root = tmp_path / "root"
    fill(root / "settled", 300)
    with compactlog.open(root / "settled") as log:
        log.compact(force=True)  # clean: nothing new will make it dirty
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (root / "settled").iterdir()}
    writers = {"orders": Writer(root / "orders"), "users": Writer(root / "users", keys=7)}
    daemon = Daemon(tmp_path, *fast(root))
    try:
        for name in writers:
            wait_for(lambda n=name: pass_status(root, n) == "cleaned", f"{name} cleaned")
        appended = {name: writer.stop() for name, writer in writers.items()}
    finally:
        code = daemon.stop()
    assert code == 0
    for name, writer in writers.items():
        latest, count = latest_in(root / name)
        assert latest == model(writer.keys, appended[name])  # nothing acknowledged is lost
        assert count < appended[name]  # and superseded records are gone
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (root / "settled").iterdir()}
    assert after == before  # the clean log was not touched
    assert state(root)["logs"][str(root / "settled")]["last_pass"] is None
    assert daemon.wait_event(lambda e: e.get("event") == "stopped")


def test_picks_up_new_logs_drops_deleted_ones_and_serves_metrics(tmp_path):
    root = tmp_path / "root"
    fill(root / "first", 400)
    daemon = Daemon(tmp_path, *fast(root))
    try:
        wait_for(lambda: pass_status(root, "first") == "cleaned", "first cleaned")
        assert scrape(root, "/healthz") == "ok\n"
        assert scrape(root, "/readyz") == "ready\n"
        writer = Writer(root / "second")  # created while the service runs, kept open
        try:
            wait_for(lambda: pass_status(root, "second") == "cleaned", "second cleaned")
            body = scrape(root)
        finally:
            writer.stop()
        for series in (
            'compactlog_cleaner_log_dirty_ratio{log="second"',
            'compactlog_cleaner_log_passes_total{log="second"',
            'compactlog_cleaner_log_records_removed_total{log="first"',
            'compactlog_cleaner_log_uncleanable{log="first"',
            "compactlog_cleaner_rounds_total",
            "compactlog_cleaner_passes_running",
            "compactlog_cleaner_uptime_seconds",
        ):
            assert series in body, series
        status = subprocess.run(
            [
                Path(sys.executable).with_name("compactlog"),
                "cleaner",
                "status",
                str(root),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert status.returncode == 0, status.stderr  # running, every log healthy
        assert json.loads(status.stdout)["running"] is True
        shutil.rmtree(root / "first")
        wait_for(lambda: 'log="first"' not in scrape(root), "first dropped from the metrics")
        # the state file is rewritten after the round's metrics: wait for it too
        wait_for(lambda: str(root / "first") not in state(root)["logs"], "first dropped from state")
    finally:
        assert daemon.stop() == 0


def test_a_corrupt_log_is_isolated_and_cleaned_again_after_repair(tmp_path):
    root = tmp_path / "root"
    fill(root / "broken", 400)
    fill(root / "healthy", 400)
    victim = segment_files(root / "broken")[1]
    position, _length = batch_positions(victim)[0]
    flip_bit(victim, position + 40)  # inside the batch: its CRC fails
    daemon = Daemon(tmp_path, *fast(root))
    try:
        wait_for(lambda: pass_status(root, "broken") == "uncleanable", "broken marked")
        wait_for(lambda: pass_status(root, "healthy") == "cleaned", "healthy cleaned")
        entry = state(root)["logs"][str(root / "broken")]
        assert "corrupt" in entry["uncleanable"]
        assert uncleanable_gauge(root, "broken") == "1.0"

        repaired = subprocess.run(
            [Path(sys.executable).with_name("compactlog"), "repair", str(root / "broken")],
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert repaired.returncode == 0, repaired.stderr
        fill(root / "broken", 200)  # new dirty data after the repair
        wait_for(lambda: pass_status(root, "broken") == "cleaned", "broken cleaned after repair")
        assert uncleanable_gauge(root, "broken") == "0.0"
    finally:
        assert daemon.stop() == 0
    latest, _count = latest_in(root / "healthy")
    assert latest == model(20, 400)


def test_a_second_service_on_the_same_root_exits_1_naming_the_first(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    first = Daemon(tmp_path, *fast(root), name="first")
    try:
        first.wait_event(lambda e: e.get("event") == "started")
        second = Daemon(tmp_path, *fast(root), name="second")
        assert second.wait() == 1
        refusal = second.wait_event(lambda e: e.get("event") == "already_running")
        assert f"pid {first.proc.pid}" in refusal["message"]
        assert first.proc.poll() is None  # the first one goes on
    finally:
        assert first.stop() == 0


def test_sigterm_when_idle_exits_0(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    daemon = Daemon(tmp_path, *fast(root))
    daemon.wait_event(lambda e: e.get("event") == "started")
    assert daemon.stop() == 0
    stopped = daemon.wait_event(lambda e: e.get("event") == "stopped")
    assert stopped.get("clean", True)
    assert state(root)["phase"] == "stopped"


def test_sigterm_mid_pass_aborts_it_within_the_grace_period(tmp_path):
    root = tmp_path / "root"
    fill(root / "big", 3000)
    writer = Writer(root / "big")  # keeps appending throughout
    # 30 KB/s: the pass would take many seconds, so the signal lands in the middle of it
    daemon = Daemon(tmp_path, *fast(root, "--io-rate", "30KB", "--grace", "20"))
    try:
        daemon.wait_event(lambda e: e.get("event") == "pass_start")
        # the state file (what `compactlog cleaner status` reads) shows the pass moving
        wait_for(
            lambda: (state(root)["logs"][str(root / "big")].get("running") or {}).get("bytes"),
            "a running pass with progress in the state file",
            proc=daemon.proc,
        )
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.wait() == 0
        appended = writer.stop()
    finally:
        daemon.kill()
        if writer.proc.poll() is None:
            writer.stop()
    aborted = daemon.wait_event(lambda e: e.get("event") == "pass")
    assert aborted["status"] == "aborted"
    stopped = daemon.wait_event(lambda e: e.get("event") == "stopped")
    assert stopped.get("clean", True)  # stopped within the grace period, passes done
    assert not [p for p in (root / "big").iterdir() if p.name.endswith(".rw")]
    latest, count = latest_in(root / "big")
    assert latest == model(20, appended)  # the writer's records are the latest ones
    assert count == 3000 + appended  # aborted before any swap: nothing removed


def test_kill_9_mid_pass_loses_nothing_and_the_next_start_cleans_up(tmp_path):
    root = tmp_path / "root"
    # the writer's 20 hot keys, each record followed by one of a key never updated: every
    # group of segments keeps records and loses records, so each is rewritten into a .rw
    # that lives while the throttled pass reads the group (with the hot keys alone only
    # the newest group had survivors, its .rw lived a few milliseconds and a loaded run
    # could poll past every one of them for a minute)
    with compactlog.open(root / "big", **SMALL) as log:
        for start in range(0, 3000, 50):
            batch = []
            for s in range(start, start + 50):
                key = b"k%d" % (s % 20)
                batch += [(key, b"%s:%d:" % (key, s) + b"x" * 80), (b"u%d" % s, b"kept")]
            log.append_batch(batch)
    unique = {b"u%d" % s: b"kept" for s in range(3000)}
    writer = Writer(root / "big")
    for attempt in range(5):
        daemon = Daemon(tmp_path, *fast(root, "--io-rate", "300KB"), name=f"killed-{attempt}")
        try:
            # a rewrite in progress: the pass is past its map and writing segments
            wait_for(
                lambda: any(p.name.endswith(".rw") for p in (root / "big").iterdir()),
                "a .rw rewrite",
                proc=daemon.proc,
            )
        finally:
            daemon.kill()
        assert daemon.proc.returncode == -signal.SIGKILL
        if [p for p in (root / "big").iterdir() if p.name.endswith(".rw")]:
            break  # died mid-rewrite
        # the group was swapped between seeing its .rw and the kill landing: kill again
    else:
        pytest.fail("the kill never landed during a rewrite in 5 attempts")
    appended_before_restart = writer.stop()
    latest, _count = latest_in(root / "big")
    # readable and complete right away
    assert latest == {**unique, **model(20, appended_before_restart)}
    (root / ".compactlog-cleaner.json.99999.tmp").write_text("{")  # a state write it died in
    again = Daemon(tmp_path, *fast(root, "--once"), name="again")
    assert again.wait() == 0
    cleaned = again.wait_event(lambda e: e.get("event") == "pass")
    assert cleaned["status"] == "cleaned", cleaned
    leftovers = [p.name for p in (root / "big").iterdir() if p.name.endswith((".rw", ".tmp"))]
    assert leftovers == []
    assert not list(root.glob("*.tmp"))
    latest, count = latest_in(root / "big")
    assert latest == {**unique, **model(20, appended_before_restart)}
    assert count < 6000 + appended_before_restart


def once_from_environment(root: Path) -> subprocess.CompletedProcess[str]:
    """One ``--once`` round configured by the environment alone, as a container runs it."""
    env = {
        **os.environ,
        "COMPACTLOG_CLEANER_ROOTS": str(root),
        "COMPACTLOG_CLEANER_METRICS_ENABLED": "false",
    }
    return subprocess.run(
        [sys.executable, "-m", "compactlog.cleaner", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )


def test_once_configured_by_the_environment_runs_one_round_and_reports_bad_logs(tmp_path):
    root = tmp_path / "root"
    fill(root / "fine", 400)
    done = once_from_environment(root)
    assert done.returncode == 0, done.stderr  # a container's settings: no flags at all
    assert "Cleaner cleaned fine" in done.stderr
    assert state(root)["phase"] == "stopped"
    fill(root / "broken", 400)
    victim = segment_files(root / "broken")[1]
    flip_bit(victim, batch_positions(victim)[0][0] + 40)
    done = once_from_environment(root)
    assert done.returncode == 1  # cron sees that a log needs attention
    assert "broken is uncleanable" in done.stderr and "compactlog repair" in done.stderr


def test_one_round_leaves_a_log_whose_keys_outgrow_the_map_clean_and_says_so(tmp_path):
    """Issue 33: a log of 1,000 keys, a map of 170 (``cleaner_buffer_bytes=4096``): one
    service pass cleans it all, and its stats line gives the dirty ratio before and after."""
    root = tmp_path / "root"
    fill(root / "wide", 3000, keys=1000, cleaner_buffer_bytes=4096)
    done = once_from_environment(root)
    assert done.returncode == 0, done.stderr
    assert "Dirty ratio 1.000 before, 0.000 after: the cleanable section is clean" in done.stderr
    latest, _count = latest_in(root / "wide")
    assert len(latest) == 1000
