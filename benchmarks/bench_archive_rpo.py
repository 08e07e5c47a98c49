"""The archive's RPO under a sustained writer, and what the archiver costs the writer.

A writer process appends ``--rate`` records/s (100-byte values, batches every 10 ms,
``sync="always"``: a batch is acknowledged once durable) for ``--seconds``, noting each
batch's end offset and the time ``append_batch`` returned. Alternating, ``--repeat`` times:
the writer alone, and the writer with ``compactlog archive run LOG URL --interval 1s`` (a
separate process, as operators run it) against SeaweedFS (``--seaweed``) or ``--url``.

- **RPO**: for every acknowledged batch, (the commit time of the first manifest whose end
  offset covers it: its ``time_ms``, the archiver's clock just before the put-if-absent of
  the manifest) minus (its acknowledgement); p50/p99/max. Batches acknowledged after the
  last commit are not counted (the archiver is stopped then). The same from the server's
  ``Last-Modified`` of the manifest is reported as a cross-check (``server_p99_s``: S3
  servers give it to the second, truncated, so it reads up to 1 s low).
- **writer overhead**: the writer's achieved rate (records over its wall time) with the
  archiver against without; at a rate the writer sustains both are the target rate, so the
  bench also reports the p99 of the per-batch append latency. ``--rate 0`` runs the writer
  flat out (batches of 500) to show what the archiver takes from the most it can do.

Run: ``python -m benchmarks.bench_archive_rpo --seaweed --rate 50000 --seconds 20``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import compactlog
from compactlog.archive import manifest as manifests
from compactlog.archive import open_store

from .archive_store import add_store_options, archive_store

TICK_S = 0.01


def writer(path: str, seconds: float, rate: int, out: str) -> None:
    """The writer process: paced batches; one line per batch (end offset, ack ns, latency)."""
    per_tick = max(rate * TICK_S, 50)
    value = os.urandom(100)
    lines = []
    with compactlog.open(path, sync="always", segment_bytes=64 << 20) as log:
        started = time.perf_counter()
        owed, written, i = 0.0, 0, 0
        while (now := time.perf_counter()) - started < seconds:
            owed = (now - started) * rate - written if rate else 500.0  # 0: flat out
            n = int(min(owed, per_tick * 10)) if owed >= 1 else 0
            if n == 0:
                time.sleep(TICK_S / 4)
                continue
            batch = [(b"key-%012d" % ((i + j) % 1_000_000), value) for j in range(n)]
            before = time.perf_counter()
            offsets = log.append_batch(batch)
            after = time.perf_counter()
            lines.append(f"{offsets[-1] + 1} {time.time_ns()} {after - before:.6f}")
            written += n
            i += n
        elapsed = time.perf_counter() - started
    with open(out, "w") as handle:
        handle.write(json.dumps({"records": written, "seconds": elapsed}) + "\n")
        handle.write("\n".join(lines) + "\n")


def run_writer(path: Path, seconds: float, rate: int) -> tuple[dict, list[tuple[int, int, float]]]:
    out = str(path) + ".acks"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_archive_rpo",
            "--writer",
            str(path),
            out,
            "--seconds",
            str(seconds),
            "--rate",
            str(rate),
        ],
        check=True,
    )
    with open(out) as handle:
        summary = json.loads(handle.readline())
        acks = [
            (int(a), int(b), float(c))
            for a, b, c in (line.split() for line in handle if line.strip())
        ]
    return summary, acks


def rpo(store: Any, acks: list[tuple[int, int, float]]) -> dict[str, float | int]:
    """Per acknowledged batch: the first manifest covering it, by commit and server time."""
    infos = {i.key: i for i in store.list(manifests.MANIFEST_PREFIX)}
    commits = []  # (end offset, server ms, commit ms), in commit order
    for key in sorted(infos):
        sequence = manifests.parse_manifest_key(key)
        if sequence is None:
            continue
        m = manifests.load(store, sequence)
        commits.append((m.end_offset, infos[key].modified_ms, m.time_ms))
    server, committed = [], []
    j = 0
    for end, ack_ns, _latency in acks:
        while j < len(commits) and commits[j][0] < end:
            j += 1
        if j == len(commits):
            break
        ack_ms = ack_ns / 1e6
        server.append((commits[j][1] - ack_ms) / 1000)
        committed.append((commits[j][2] - ack_ms) / 1000)

    def pct(values: list[float], q: float) -> float:
        return (
            sorted(values)[min(int(q * len(values)), len(values) - 1)] if values else float("nan")
        )

    return {
        "batches": len(committed),
        "commits": len(commits),
        "rpo_p50_s": pct(committed, 0.5),
        "rpo_p99_s": pct(committed, 0.99),
        "rpo_max_s": max(committed, default=float("nan")),
        "server_p99_s": pct(server, 0.99),
    }


def run(url: str, rate: int, seconds: float, repeat: int, say=print) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-archive-rpo-"))
    try:
        alone, along, rpos, lat_alone, lat_along = [], [], [], [], []
        for i in range(repeat):
            summary, acks = run_writer(root / f"alone-{i}", seconds, rate)
            alone.append(summary["records"] / summary["seconds"])
            lat_alone.append(statistics.quantiles([a[2] for a in acks], n=100)[98])
            shutil.rmtree(root / f"alone-{i}")

            log_path = root / f"along-{i}"
            compactlog.open(log_path, sync="always", segment_bytes=64 << 20).close()
            prefix = f"{url}/rpo-{uuid.uuid4().hex[:8]}"
            archiver = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "compactlog",
                    "archive",
                    "run",
                    str(log_path),
                    prefix,
                    "--interval",
                    "1s",
                ],
                stdout=subprocess.DEVNULL,
            )
            try:
                time.sleep(1.0)
                summary, acks = run_writer(log_path, seconds, rate)
                time.sleep(3.0)  # the last batches' round
            finally:
                archiver.send_signal(signal.SIGTERM)
                archiver.wait(60)
            along.append(summary["records"] / summary["seconds"])
            lat_along.append(statistics.quantiles([a[2] for a in acks], n=100)[98])
            rpos.append(rpo(open_store(prefix), acks))
            shutil.rmtree(log_path)
            say(
                f"round {i}: alone {alone[-1]:,.0f}/s with archiver {along[-1]:,.0f}/s "
                f"rpo {rpos[-1]} load {os.getloadavg()[0]:.1f}"
            )
        return {
            "target_rate": rate,
            "rate_alone": statistics.median(alone),
            "rate_with_archiver": statistics.median(along),
            "rate_ratio": statistics.median(along) / statistics.median(alone),
            "append_p99_ms_alone": statistics.median(lat_alone) * 1000,
            "append_p99_ms_with_archiver": statistics.median(lat_along) * 1000,
            "rpo_p99_s": statistics.median(r["rpo_p99_s"] for r in rpos),
            "rpo_p50_s": statistics.median(r["rpo_p50_s"] for r in rpos),
            "rpo_max_s": max(r["rpo_max_s"] for r in rpos),
            "server_p99_s": statistics.median(r["server_p99_s"] for r in rpos),
            "load": os.getloadavg()[0],
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_store_options(parser)
    parser.add_argument("--rate", type=int, default=50_000, help="records/s the writer aims at")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--writer", nargs=2, metavar=("LOG", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.writer:
        writer(args.writer[0], args.seconds, args.rate, args.writer[1])
        return
    with archive_store(args, "bench-archive-rpo-store-") as (url, _scratch):
        result = run(url, args.rate, args.seconds, args.repeat)
    print(json.dumps(result, indent=2) if args.json else result)


if __name__ == "__main__":
    main()
