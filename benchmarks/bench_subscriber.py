"""Subscriber benchmarks: tailing throughput and flush-to-poll latency.

Workloads (each with another *process* writing, as in production):

``tail``      a writer process appends ``records`` records in 1,000-record batches as fast as
              it can; a subscriber in this process tails it with ``poll_batches`` from the
              first record on. Reported: writer and subscriber records/s over the same
              wall-clock window, and how far the subscriber finished behind the writer's
              final ``flush()`` returning (negative: it had everything before that).
``catch_up``  the same subscriber API reading the finished log from the start: the rate at
              which a subscriber that fell behind catches up.
``latency``   a writer process appends one record at a time, each carrying the monotonic
              clock (ns) read just *before* ``append()`` + ``flush()``; the subscriber waits
              in ``poll(timeout_s=1)`` and subtracts on return. The measured interval thus
              includes the append itself: an upper bound of flush()->poll() latency. Run
              with the inotify waiter and with the sleep-polling fallback.

Run standalone (``python benchmarks/bench_subscriber.py [--records N] [--json]``) or call
:func:`run`, which returns a dict.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import compactlog

BATCH = 1000
VALUE = b"v" * 24


def _writer_tail(path: str, records: int) -> None:
    keys = [b"key-%010d" % i for i in range(BATCH)]
    batch = [(k, VALUE) for k in keys]
    with compactlog.open(path, sync="os") as log:
        print(f"start {time.monotonic_ns()}", flush=True)
        for _ in range(records // BATCH):
            log.append_batch(batch)
        log.flush()
        print(f"end {time.monotonic_ns()}", flush=True)


def _writer_latency(path: str, samples: int, seed: int) -> None:
    rng = random.Random(seed)
    with compactlog.open(path) as log:
        print("ready", flush=True)
        sys.stdin.readline()  # the subscriber is waiting
        for _ in range(samples):
            time.sleep(rng.uniform(0.001, 0.004))  # pacing, so that each sample waits
            t0 = time.monotonic_ns()
            log.append(b"t", str(t0).encode())
            log.flush()


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), *args],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )


def bench_tail(directory: str, records: int) -> dict[str, Any]:
    path = os.path.join(directory, "tail")
    with compactlog.open(path, sync="os") as log:
        sub = log.subscribe("bench")  # durable from offset 0
        writer = _spawn("--writer-tail", path, str(records))
        assert writer.stdout is not None
        started = int(writer.stdout.readline().split()[1])
        got = 0
        polls = 0
        max_lag = 0
        while got < records:
            batches = sub.poll_batches(max_records=100_000, timeout_s=5.0)
            if not batches:
                raise RuntimeError(f"subscriber stalled at {sub.position} of {records}")
            polls += 1
            got += sum(len(b) for b in batches)
            max_lag = max(max_lag, sub.lag)
        sub_done = time.monotonic_ns()
        writer_done = int(writer.stdout.readline().split()[1])
        writer.wait()
        sub.commit()
        sub.close()
    writer_s = (writer_done - started) / 1e9
    sub_s = (sub_done - started) / 1e9
    return {
        "records": records,
        "writer_records_per_s": round(records / writer_s),
        "subscriber_records_per_s": round(records / sub_s),
        "subscriber_finished_after_writer_ms": round((sub_done - writer_done) / 1e6, 2),
        "polls": polls,
        "max_lag_records": max_lag,
    }


def bench_catch_up(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, "tail")
    with compactlog.open(path, read_only=True) as log:
        end = log.end_offset
        best = float("inf")
        for _ in range(3):
            sub = log.subscribe("~catch-up", start=0)
            t0 = time.perf_counter()
            got = 0
            size = 0
            while got < end:
                for batch in sub.poll_batches(max_records=100_000):
                    got += len(batch)
                    size += batch.size_bytes
            best = min(best, time.perf_counter() - t0)
            sub.close()
    return {
        "records": end,
        "records_per_s": round(end / best),
        "mb_per_s": round(size / best / 1e6, 1),
    }


def bench_latency(directory: str, samples: int, *, inotify: bool) -> dict[str, Any]:
    path = os.path.join(directory, "latency-" + ("inotify" if inotify else "sleep"))
    compactlog.open(path).close()
    writer = _spawn("--writer-latency", path, str(samples))
    assert writer.stdout is not None and writer.stdin is not None
    writer.stdout.readline()
    latencies = []
    with compactlog.open(path, read_only=True) as log:
        sub = log.subscribe("~latency")
        if not inotify:
            sub._watcher().reliable = False  # force the sleep-polling fallback
        cpu0 = time.process_time()
        wall0 = time.monotonic()
        writer.stdin.write("go\n")
        writer.stdin.flush()
        while len(latencies) < samples:
            records = sub.poll(max_records=1, timeout_s=1.0)
            now = time.monotonic_ns()
            if not records:
                raise RuntimeError("no record within 1 s")
            latencies.append((now - int(records[0].value)) / 1e6)
        cpu = time.process_time() - cpu0
        wall = time.monotonic() - wall0
        sub.close()
    writer.wait()
    latencies.sort()
    return {
        "waiter": "inotify" if inotify else "sleep-polling",
        "samples": samples,
        "median_ms": round(statistics.median(latencies), 3),
        "p90_ms": round(latencies[int(0.9 * (samples - 1))], 3),
        "p99_ms": round(latencies[int(0.99 * (samples - 1))], 3),
        "max_ms": round(latencies[-1], 3),
        "subscriber_cpu_percent": round(100 * cpu / wall, 1),
    }


def setup_header() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "batch_records": BATCH,
        "value_bytes": len(VALUE),
    }


def run(records: int = 2_000_000, latency_samples: int = 300) -> dict[str, Any]:
    """All workloads; returns ``{"setup": ..., "tail": ..., "catch_up": ..., "latency": [...]}``."""
    records = max(BATCH, records // BATCH * BATCH)
    with tempfile.TemporaryDirectory(prefix="bench-subscriber-") as directory:
        result: dict[str, Any] = {"setup": setup_header()}
        result["tail"] = bench_tail(directory, records)
        result["catch_up"] = bench_catch_up(directory)
        result["latency"] = [
            bench_latency(directory, latency_samples, inotify=True),
            bench_latency(directory, latency_samples, inotify=False),
        ]
    result["targets_met"] = {
        # the tailing rate is bounded by the writer's: "keeps up" = done with the writer
        "tail_keeps_up": result["tail"]["subscriber_finished_after_writer_ms"] <= 50,
        "tail_1M_records_per_s": result["tail"]["subscriber_records_per_s"] >= 1_000_000,
        "catch_up_1M_records_per_s": result["catch_up"]["records_per_s"] >= 1_000_000,
        "median_latency_below_5ms": result["latency"][0]["median_ms"] < 5.0,
    }
    return result


def _print_table(result: dict[str, Any]) -> None:
    setup = result["setup"]
    print(
        f"# subscriber benchmark: Python {setup['python']}, {setup['cpu']}, "
        f"{setup['cores']} cores, {setup['batch_records']}-record batches"
    )
    tail = result["tail"]
    print(
        f"tail      {tail['records']:>10,} records  writer {tail['writer_records_per_s']:>11,}/s"
        f"  subscriber {tail['subscriber_records_per_s']:>11,}/s"
        f"  finished {tail['subscriber_finished_after_writer_ms']} ms after the writer"
    )
    catch = result["catch_up"]
    print(
        f"catch_up  {catch['records']:>10,} records  {catch['records_per_s']:>11,}/s"
        f"  {catch['mb_per_s']} MB/s"
    )
    for lat in result["latency"]:
        print(
            f"latency   {lat['waiter']:<14} median {lat['median_ms']} ms  p90 {lat['p90_ms']} ms"
            f"  p99 {lat['p99_ms']} ms  max {lat['max_ms']} ms"
            f"  cpu {lat['subscriber_cpu_percent']}%"
        )
    print("targets met:", result["targets_met"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--latency-samples", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--writer-tail", nargs=2, metavar=("PATH", "RECORDS"))
    parser.add_argument("--writer-latency", nargs=2, metavar=("PATH", "SAMPLES"))
    args = parser.parse_args(argv)
    if args.writer_tail:
        _writer_tail(args.writer_tail[0], int(args.writer_tail[1]))
        return
    if args.writer_latency:
        _writer_latency(args.writer_latency[0], int(args.writer_latency[1]), seed=1)
        return
    result = run(args.records, args.latency_samples)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_table(result)


if __name__ == "__main__":
    main()
