"""A/B of the append paths against another version of compactlog, in alternating processes.

A change to a hot path is measured against the code it replaces on the same machine at the
same time: each round runs one process with this checkout's ``compactlog`` and one with the
other version's, in turn, so that load from anything else falls on both alike. Usage::

    git worktree add /tmp/old-main <rev>      # or: git archive <rev> compactlog | tar -x -C DIR
    python -m benchmarks.ab_appends --old /tmp/old-main --rounds 5

Rows (16-byte keys, 100-byte values, microseconds per record, the median over rounds):
single ``append`` with the default settings, with ``exclusive=True``, into a 4 MiB precommit
buffer; ``append_batch`` of 1,000; single appends and 1,000-record batches under
``sync="always"``. Each measurement includes the final ``flush()``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKLOADS = {
    # name: (records, open() settings, how records are appended)
    "single, default": (200_000, {}, "single"),
    "single, exclusive=True": (200_000, {"exclusive": True}, "single"),
    "single, precommit 4 MiB": (200_000, {"precommit_bytes": 4 << 20}, "single"),
    "append_batch x 1,000": (1_000_000, {}, "batch"),
    'single, sync="always"': (3_000, {"sync": "always"}, "single"),
    'append_batch x 1,000, sync="always"': (200_000, {"sync": "always"}, "batch"),
}


def _worker(name: str) -> None:
    """Run one workload with whatever ``compactlog`` is first on ``sys.path``; print us/rec."""
    import compactlog

    count, settings, mode = WORKLOADS[name]
    keys = [b"key-%012d" % i for i in range(count)]
    value = os.urandom(100)
    with tempfile.TemporaryDirectory(dir=os.environ.get("AB_TMP")) as directory:
        exclusive = settings.get("exclusive", False)
        config = {k: v for k, v in settings.items() if k != "exclusive"}
        log = compactlog.open(os.path.join(directory, "log"), exclusive=exclusive, **config)
        started = time.perf_counter()
        if mode == "single":
            append = log.append
            for key in keys:
                append(key, value)
        else:
            for lo in range(0, count, 1000):
                log.append_batch([(key, value) for key in keys[lo : lo + 1000]])
        log.flush()
        elapsed = time.perf_counter() - started
        log.close()
    print(json.dumps({"us": elapsed / count * 1e6}))


def _run(name: str, path: str) -> float:
    env = dict(os.environ, PYTHONPATH=path)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.ab_appends", "--worker", name],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", help="a directory holding the other version's compactlog/")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", action="append", help="run only these workloads")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    if not args.old:
        parser.error("--old is required")
    new = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = args.only or list(WORKLOADS)
    print(f"{'workload':40} {'old us':>9} {'new us':>9} {'new/old':>8}")
    for name in names:
        old_times, new_times = [], []
        for _ in range(args.rounds):
            old_times.append(_run(name, args.old))
            new_times.append(_run(name, new))
        old, fresh = statistics.median(old_times), statistics.median(new_times)
        print(f"{name:40} {old:9.3f} {fresh:9.3f} {fresh / old:8.3f}", flush=True)


if __name__ == "__main__":
    main()
