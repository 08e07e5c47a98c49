"""A/B of the hot paths against another version of compactlog, in alternating processes.

A change to a hot path is measured against the code it replaces on the same machine at the
same time: each round runs one process with this checkout's ``compactlog`` and one with the
other version's, in turn, so that load from anything else falls on both alike. Usage::

    git archive <rev> compactlog | tar -x -C /tmp/old-main
    python -m benchmarks.ab --old /tmp/old-main --rounds 5 [--group reads] [--only NAME] [--cpu]

On a loaded machine ``--cpu`` times each operation's CPU time (``time.process_time``)
instead of the wall clock: a process that waits for a core then costs nothing extra.

Rows (16-byte keys, 100-byte values, microseconds per record, the median over rounds). Only
the named operation is timed: building the log a read or a compaction starts from is not.

- appends: single ``append`` with the default settings, with ``exclusive=True``, into a 4 MiB
  precommit buffer; ``append_batch`` of 1,000; single appends and 1,000-record batches under
  ``sync="always"``. Each includes the final ``flush()``.
- reads: ``read()`` and ``read_batches()`` over a log written by single appends (one record a
  batch) and over a log written in batches of 1,000; a subscriber polling each log.
- compaction: ``compact(force=True)`` of 1,000,000 records over 100,000 keys, and
  ``latest_batches()`` of the compacted log.
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
from collections.abc import Callable
from typing import Any

KEY_COUNT = 100_000


def _keys(count: int, distinct: int | None = None) -> list[bytes]:
    if distinct is None:
        return [b"key-%012d" % i for i in range(count)]
    return [b"key-%012d" % ((i * 7919) % distinct) for i in range(count)]


def _append_singles(log: Any, keys: list[bytes], value: bytes) -> None:
    append = log.append
    for key in keys:
        append(key, value)
    log.flush()


def _append_batches(log: Any, keys: list[bytes], value: bytes) -> None:
    for lo in range(0, len(keys), 1000):
        log.append_batch([(key, value) for key in keys[lo : lo + 1000]])
    log.flush()


def _read_records(log: Any) -> int:
    return sum(1 for _ in log.read())


def _read_batches(log: Any) -> int:
    return sum(len(batch) for batch in log.read_batches())


def _poll_all(log: Any) -> int:
    subscriber = log.subscribe("~ab", start=0)
    seen, end = 0, log.end_offset
    while seen < end:
        seen += sum(len(batch) for batch in subscriber.poll_batches(10_000))
    return seen


def _latest_batches(log: Any) -> int:
    return sum(len(batch) for batch in log.latest_batches())


def _compact(log: Any) -> None:
    log.compact(force=True)


def _compacted_batches(log: Any, keys: list[bytes], value: bytes) -> None:
    _append_batches(log, keys, value)
    _compact(log)


# name: (group, records, open() settings, how the log is built, the timed operation or None)
# With no timed operation the build itself is timed (the append rows).
Build = Callable[[Any, list[bytes], bytes], None]
WORKLOADS: dict[str, tuple[str, int, dict[str, Any], Build, Callable[[Any], Any] | None]] = {
    "single, default": ("appends", 200_000, {}, _append_singles, None),
    "single, exclusive=True": ("appends", 200_000, {"exclusive": True}, _append_singles, None),
    "single, precommit 4 MiB": (
        "appends",
        200_000,
        {"precommit_bytes": 4 << 20},
        _append_singles,
        None,
    ),
    "append_batch x 1,000": ("appends", 1_000_000, {}, _append_batches, None),
    'single, sync="always"': ("appends", 3_000, {"sync": "always"}, _append_singles, None),
    'append_batch x 1,000, sync="always"': (
        "appends",
        200_000,
        {"sync": "always"},
        _append_batches,
        None,
    ),
    "read() of single appends": ("reads", 200_000, {}, _append_singles, _read_records),
    "read_batches() of single appends": ("reads", 200_000, {}, _append_singles, _read_batches),
    "read() of batches": ("reads", 1_000_000, {}, _append_batches, _read_records),
    "read_batches() of batches": ("reads", 1_000_000, {}, _append_batches, _read_batches),
    "subscriber poll of batches": ("reads", 1_000_000, {}, _append_batches, _poll_all),
    "subscriber poll of single appends": ("reads", 200_000, {}, _append_singles, _poll_all),
    "compact(force=True), 100k keys": ("compaction", 1_000_000, {}, _append_batches, _compact),
    "latest_batches() of compacted": (
        "compaction",
        1_000_000,
        {},
        _compacted_batches,
        _latest_batches,
    ),
}


def _worker(name: str) -> None:
    """Run one workload with whatever ``compactlog`` is first on ``sys.path``; print us/rec."""
    import compactlog

    group, count, settings, build, operation = WORKLOADS[name]
    keys = _keys(count, KEY_COUNT if group == "compaction" else None)
    value = os.urandom(100)
    with tempfile.TemporaryDirectory(dir=os.environ.get("AB_TMP")) as directory:
        exclusive = settings.get("exclusive", False)
        config = {k: v for k, v in settings.items() if k != "exclusive"}
        log = compactlog.open(os.path.join(directory, "log"), exclusive=exclusive, **config)
        clock = time.process_time if os.environ.get("AB_CLOCK") == "cpu" else time.perf_counter
        if operation is None:
            started = clock()
            build(log, keys, value)
        else:
            build(log, keys, value)
            started = clock()
            operation(log)
        elapsed = clock() - started
        log.close()
    print(json.dumps({"us": elapsed / count * 1e6, "module": compactlog.__file__}))


def _run(name: str, path: str) -> float:
    # ``python -m`` puts its working directory first on sys.path: run from an empty one, so
    # that ``compactlog`` comes from ``path`` (this checkout only supplies ``benchmarks``)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([path, here]))
    with tempfile.TemporaryDirectory() as empty:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.ab", "--worker", name],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            cwd=empty,
        ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if not result["module"].startswith(os.path.abspath(path) + os.sep):
        raise SystemExit(f"measured {result['module']}, not the compactlog in {path}")
    return float(result["us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", help="a directory holding the other version's compactlog/")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--group", action="append", choices=["appends", "reads", "compaction"])
    parser.add_argument("--only", action="append", help="run only these workloads")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="time the process's CPU (its own work, whatever the load), not the wall clock",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cpu:
        os.environ["AB_CLOCK"] = "cpu"  # (the workers inherit it)
    if args.worker:
        _worker(args.worker)
        return
    if not args.old:
        parser.error("--old is required")
    unknown = set(args.only or ()) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; known: {list(WORKLOADS)}")
    new = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = args.only or [n for n, w in WORKLOADS.items() if not args.group or w[0] in args.group]
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
