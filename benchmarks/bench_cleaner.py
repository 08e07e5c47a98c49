"""Cleaner service benchmarks: the real ``compactlog-cleaner`` process on a root of logs.

Workloads:

``idle_cpu``       100 logs under one root, 10 of them dirty. Once the dirty ones are cleaned,
                   the service's CPU (``utime + stime`` from ``/proc/<pid>/stat``) over a
                   window of idle rounds, as a percentage of one core. Target: under 2%.
``first_pass``     seconds from the service's start-up line to the start of the pass on the
                   dirtiest log (it must be the first pass: ranking). Target: within one
                   interval.
``throttle``       one dirty log cleaned by ``--once --io-rate N``; the I/O rate the pass
                   achieved (bytes the throttler charged: map reads, CRC checks, rewrite
                   reads and writes, over the pass's elapsed time). Target: within 10% of N.

Run standalone (``python -m benchmarks.bench_cleaner [--json]``) or call :func:`run`,
which returns a dict. Numbers on a shared machine are noisy: the load average is recorded
beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import compactlog

MB = 1_000_000
VALUE = b"v" * 100


def _fill(path: Path, records: int, keys: int, *, segment_bytes: int) -> None:
    with compactlog.open(path, segment_bytes=segment_bytes, sync="os") as log:
        for start in range(0, records, 500):
            log.append_batch(
                [(b"key-%06d" % (i % keys), VALUE) for i in range(start, min(records, start + 500))]
            )


def _make_root(root: Path, logs: int, dirty: int) -> str:
    """``logs - dirty`` clean logs and ``dirty`` dirty ones; returns the dirtiest's name."""
    for i in range(logs - dirty):
        path = root / f"clean-{i:03d}"
        _fill(path, 300, 50, segment_bytes=4096)
        with compactlog.open(path) as log:
            log.compact(force=True)
    for i in range(dirty):
        path = root / f"dirty-{i:02d}"
        _fill(path, 2000, 100, segment_bytes=4096)
        if i:  # all but the first were cleaned once, then got new data: lower ratios
            with compactlog.open(path) as log:
                log.compact(force=True)
            _fill(path, 200 * i, 100, segment_bytes=4096)
    return "dirty-00"


class _Service:
    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self.err = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "compactlog.cleaner", "--log-format", "json", *args],
            stdout=subprocess.DEVNULL,
            stderr=self.err,
        )

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.log_path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found

    def wait_for(self, predicate: Any, timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if predicate(event):
                    return event
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"event not seen; log:\n{self.log_path.read_text()[-2000:]}")

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=120)
        finally:
            self.err.close()


def bench_idle_and_first_pass(
    directory: Path, logs: int, dirty: int, interval: float, window: float
) -> dict[str, Any]:
    root = directory / "root"
    dirtiest = _make_root(root, logs, dirty)
    service = _Service(
        ["--root", str(root), "--interval", str(interval), "--metrics-port", "0", "--workers", "2"],
        directory / "idle.log",
    )
    try:
        started = service.wait_for(lambda e: e.get("event") == "started")
        first = service.wait_for(lambda e: e.get("event") == "pass_start")
        state_path = root / ".compactlog-cleaner.json"
        cleaned: set[str] = set()
        deadline = time.monotonic() + 300
        while len(cleaned) < dirty and time.monotonic() < deadline:
            cleaned = {
                e["log"]
                for e in service.events()
                if e.get("event") == "pass" and e.get("status") == "cleaned"
            }
            time.sleep(0.1)
        time.sleep(interval)  # let the round that cleaned them finish
        rounds_before = json.loads(state_path.read_text())["rounds"]
        cpu_before, wall_before = service.cpu_seconds(), time.monotonic()
        time.sleep(window)
        cpu_after, wall_after = service.cpu_seconds(), time.monotonic()
        rounds_after = json.loads(state_path.read_text())["rounds"]
    finally:
        code = service.stop()
    cpu = cpu_after - cpu_before
    wall = wall_after - wall_before
    rounds = rounds_after - rounds_before
    return {
        "logs": logs,
        "dirty": dirty,
        "dirty_cleaned": len(cleaned),
        "interval_s": interval,
        "idle_window_s": round(wall, 2),
        "idle_rounds": rounds,
        "idle_cpu_percent_of_one_core": round(100 * cpu / wall, 3),
        "cpu_ms_per_idle_round": round(1000 * cpu / rounds, 2) if rounds else None,
        "first_pass_log": first["log"],
        "first_pass_is_dirtiest": first["log"] == dirtiest,
        "first_pass_after_start_s": round(first["ts"] - started["ts"], 3),
        "exit_code": code,
    }


def bench_throttle(directory: Path, rate_mb: float, log_mb: float) -> dict[str, Any]:
    root = directory / f"throttle-{rate_mb:g}"
    records = int(log_mb * MB / (len(VALUE) + 40))
    _fill(root / "big", records, 1000, segment_bytes=1 << 20)
    service = _Service(
        ["--root", str(root), "--once", "--no-metrics", "--io-rate", f"{rate_mb}MB"],
        directory / f"throttle-{rate_mb:g}.log",
    )
    try:
        event = service.wait_for(lambda e: e.get("event") == "pass")
    finally:
        service.stop()
    stats = event["stats"]
    charged = (
        stats["map_bytes_read"]
        + stats["verify_bytes_read"]
        + stats["bytes_read"]
        + stats["bytes_written"]
    )
    measured = charged / stats["elapsed_seconds"] / MB
    return {
        "target_MB_per_s": rate_mb,
        "measured_MB_per_s": round(measured, 3),
        "error_percent": round(100 * (measured - rate_mb) / rate_mb, 2),
        "bytes_charged": charged,
        "pass_seconds": round(stats["elapsed_seconds"], 2),
        "throttled_seconds": round(stats["throttled_seconds"], 2),
    }


def run(
    logs: int = 100,
    dirty: int = 10,
    interval: float = 2.0,
    window: float = 20.0,
    rates: tuple[float, ...] = (2.0, 8.0),
    log_mb: float = 12.0,
) -> dict[str, Any]:
    """Every workload; a dict of figures (with the load average before and after)."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-cleaner-") as scratch:
        directory = Path(scratch)
        idle = bench_idle_and_first_pass(directory, logs, dirty, interval, window)
        throttle = {f"{r:g} MB/s": bench_throttle(directory, r, log_mb) for r in rates}
    load_after = os.getloadavg()
    return {
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "cpus": os.cpu_count(),
        "idle_and_first_pass": idle,
        "throttle": throttle,
        "targets": {
            "idle CPU < 2% of one core": idle["idle_cpu_percent_of_one_core"] < 2,
            "dirtiest log first, within one interval": idle["first_pass_is_dirtiest"]
            and idle["first_pass_after_start_s"] <= interval,
            "throttle within 10%": all(abs(t["error_percent"]) <= 10 for t in throttle.values()),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_cleaner")
    parser.add_argument("--logs", type=int, default=100)
    parser.add_argument("--dirty", type=int, default=10)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=20.0, help="idle seconds measured")
    parser.add_argument("--rate", type=float, action="append", help="MB/s (repeatable)")
    parser.add_argument("--log-mb", type=float, default=12.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(
        args.logs,
        args.dirty,
        args.interval,
        args.window,
        tuple(args.rate or (2.0, 8.0)),
        args.log_mb,
    )
    print(json.dumps(result, indent=1) if args.json else _text(result))
    return 0


def _text(result: dict[str, Any]) -> str:
    lines = [
        f"load average before {result['load_average_before']}, after "
        f"{result['load_average_after']} ({result['cpus']} CPUs)"
    ]
    for key, value in result["idle_and_first_pass"].items():
        lines.append(f"  {key}: {value}")
    for name, figures in result["throttle"].items():
        lines.append(f"  throttle {name}: {figures}")
    for name, met in result["targets"].items():
        lines.append(f"  target {name}: {'met' if met else 'NOT met'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
