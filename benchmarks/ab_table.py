"""A/B of a table's restore against another version of compactlog, in alternating processes.

The restore rows of ``bench_table`` (1M keys of 16 B/100 B by default, the same log for
both versions): a dict from ``read_batches()`` (the reference), ``Table`` until point reads
serve, ``Table`` until its dict is built, and a ``store="disk"`` restore. Each round runs
one process of this checkout and one of the other version (``--old``, e.g. ``git archive
main compactlog | tar -x -C /tmp/old``), in turn, so load from anything else falls on both
alike; the medians and the new/old ratios of records/s are printed. Usage::

    python -m benchmarks.ab_table --old /tmp/old --rounds 5 [--records N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROWS = ("dict(read_batches())", "Table restore", "Table restore + dict", "disk store restore")


def _worker(directory: str, scratch: str) -> None:
    """One process's measurement of every row (printed as JSON)."""
    import compactlog
    from benchmarks.bench_table import _from_batches, _wait_for_dict

    out = {}
    started = time.perf_counter()
    _from_batches(directory, "read_batches")
    out[ROWS[0]] = time.perf_counter() - started
    started = time.perf_counter()
    with compactlog.Table(directory, follow=False) as table:
        out[ROWS[1]] = time.perf_counter() - started
        _wait_for_dict(table)
        out[ROWS[2]] = time.perf_counter() - started
    state = os.path.join(scratch, "state")
    shutil.rmtree(state, ignore_errors=True)
    started = time.perf_counter()
    with compactlog.Table(directory, store="disk", state_dir=state, follow=False):
        out[ROWS[3]] = time.perf_counter() - started
    shutil.rmtree(state, ignore_errors=True)
    print(json.dumps(out))


def _run(code: str, directory: str, scratch: str) -> dict[str, float]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([code, here]))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.ab_table", "--worker", directory, scratch],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=code,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", help="a directory holding the other version's compactlog/")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(*args.worker)
        return
    from benchmarks.bench_table import build_log

    new = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as scratch:
        directory = os.path.join(scratch, "log")
        build_log(directory, args.records)
        times: dict[str, dict[str, list[float]]] = {"new": {}, "old": {}}
        for _round in range(args.rounds):
            for version, code in (("new", new), ("old", args.old)):
                for row, seconds in _run(code, directory, scratch).items():
                    times[version].setdefault(row, []).append(seconds)
    reference = {v: statistics.median(times[v][ROWS[0]]) for v in times}
    for row in ROWS:
        rate = {v: args.records / statistics.median(times[v][row]) / 1e6 for v in times}
        to_ref = {v: reference[v] / statistics.median(times[v][row]) for v in times}
        print(
            f"{row:22s} new {rate['new']:5.2f} M/s ({to_ref['new']:.2f}x read_batches)  "
            f"old {rate['old']:5.2f} M/s ({to_ref['old']:.2f}x)  "
            f"new/old {rate['new'] / rate['old']:.2f}"
        )


if __name__ == "__main__":
    main()
