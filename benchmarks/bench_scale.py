"""Every step a user runs, at growing sizes: is the cost per record flat (issue 33)?

Workload (the issue's): ``N`` records appended with ``append_batch`` in batches of 1,000;
keys of 16 to 24 bytes over ``N / 10`` distinct keys (each batch draws its keys at random),
100-byte values, 5% tombstones. Steps, in this order, on the one log of each size:

``append``            the ``append_batch`` calls and the final ``flush()`` (the workload's
                      generation is not timed)
``read_batches``      ``for b in log.read_batches()``
``read``              ``for r in log.read()``
``compact``           ``log.compact(force=True)`` until a pass leaves the cleaner point at
                      the end of the cleanable section (the passes are counted)
``table_memory``      ``Table(path, follow=False)`` until its dict is built
``table_disk``        ``Table(path, follow=False, store="disk", state_dir=...)``, fresh
``arrow_restore``     ``spark.restore.restore(path, out, engine="arrow")`` (Parquet)
``reopen_after_kill`` a writer process appending batches is killed with SIGKILL, then
                      ``compactlog.open(path)`` (recovery) and ``close()``

Each step runs in a process of its own (``--step``), so its peak RSS (``ru_maxrss``) is
its own; the process reports CPU time (``time.process_time``), wall time and peak RSS.
"Per record" divides by ``N``, the workload's records, for every step (after compaction
the log holds fewer). ``reopen_after_kill`` is reported in seconds, not per record.

Results go to a JSON file (sizes already there are kept unless run again) and are
rendered into ``docs/benchmarks.md`` between ``<!-- generated: bench_scale -->`` and
``<!-- end generated -->`` (the convention of ``make bench``'s generated sections), with
a plot of CPU per record against size. Timings on a loaded machine measure the load: run
it on a quiet one. Usage::

    python -m benchmarks.bench_scale                     # 1M, 10M, 50M (100M: --sizes)
    python -m benchmarks.bench_scale --sizes 1M,10M --root /big/disk
    python -m benchmarks.bench_scale --render            # the doc from the JSON only
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from . import report_page

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SIZES = (1_000_000, 10_000_000, 50_000_000)
DEFAULT_RESULTS = REPO_ROOT / "docs" / "bench_scale.json"
DEFAULT_DOC = REPO_ROOT / "docs" / "benchmarks.md"
DEFAULT_PLOT = REPO_ROOT / "docs" / "bench_scale.png"
SECTION = "bench_scale"
BATCH = 1000
VALUE_BYTES = 100
TOMBSTONE_SHARE = 0.05
BYTES_PER_RECORD_ON_DISK = 400  # the log, its compacted copy, restores and tables, with room
MAX_PASSES = 10_000
STEPS = (
    "append",
    "read_batches",
    "read",
    "compact",
    "table_memory",
    "table_disk",
    "arrow_restore",
    "reopen_after_kill",
)
TITLES = {
    "append": "append (`append_batch` x 1,000)",
    "read_batches": "`read_batches()`",
    "read": "`read()`",
    "compact": "compaction until clean",
    "table_memory": "`Table` in memory",
    "table_disk": '`Table`, `store="disk"`',
    "arrow_restore": "Arrow restore (Parquet)",
    "reopen_after_kill": "reopen after kill -9 (s)",
}
TARGETS = (  # (step, smaller size, larger size, most growth allowed): issue 33
    ("compact", 1_000_000, 50_000_000, 1.3),
    *((step, 10_000_000, 50_000_000, 1.3) for step in STEPS if step != "reopen_after_kill"),
)


# -- the workload ------------------------------------------------------------------------


def workload(records: int, seed: int = 33) -> Iterator[list[tuple[bytes, bytes | None]]]:
    """The records in batches of :data:`BATCH`: keys of 16 to 24 bytes over
    ``records // 10`` keys, 100-byte values, 5% tombstones."""
    import numpy as np

    rng = np.random.default_rng(seed)
    keyspace = max(records // 10, 1)
    for start in range(0, records, BATCH):
        size = min(BATCH, records - start)
        ids = rng.integers(0, keyspace, size).tolist()
        removed = (rng.random(size) < TOMBSTONE_SHARE).tolist()
        yield [
            (
                key_bytes(key),
                None if gone else b"%-*d" % (VALUE_BYTES, start + i),
            )
            for i, (key, gone) in enumerate(zip(ids, removed, strict=True))
        ]


def key_bytes(key: int) -> bytes:
    """Key number ``key`` as 16 to 24 bytes."""
    return b"%016d" % key + b"k" * (key % 9)


# -- the steps (each in its own process) -------------------------------------------------


def _append(log_dir: Path, records: int, scratch: Path) -> dict[str, Any]:
    import compactlog

    cpu = wall = 0.0
    with compactlog.open(log_dir) as log:
        for batch in workload(records):
            c, w = time.process_time(), time.perf_counter()
            log.append_batch(batch)
            cpu += time.process_time() - c
            wall += time.perf_counter() - w
        c, w = time.process_time(), time.perf_counter()
        log.flush()
        cpu += time.process_time() - c
        wall += time.perf_counter() - w
        end = log.end_offset
    return {"cpu_s": cpu, "wall_s": wall, "end_offset": end, "log_bytes": _du(log_dir)}


def _read_batches(log_dir: Path, records: int, scratch: Path) -> dict[str, Any]:
    import compactlog

    with compactlog.open(log_dir, read_only=True) as log:
        return {"records_read": sum(len(batch) for batch in log.read_batches())}


def _read(log_dir: Path, records: int, scratch: Path) -> dict[str, Any]:
    import compactlog

    with compactlog.open(log_dir, read_only=True) as log:
        return {"records_read": sum(1 for _record in log.read())}


def _compact(log_dir: Path, records: int, scratch: Path) -> dict[str, Any]:
    import compactlog

    passes = read = written = cleaned = 0
    with compactlog.open(log_dir) as log:
        for passes in range(1, MAX_PASSES + 1):  # noqa: B007 (the count is reported)
            stats = log.compact(force=True)
            read += stats.bytes_read
            written += stats.bytes_written
            cleaned += stats.records_read
            if not stats.cleaned or stats.new_first_dirty_offset >= stats.first_uncleanable_offset:
                break
    return {
        "passes": passes,
        "bytes_read": read,
        "bytes_written": written,
        "records_cleaned": cleaned,  # (the active segment is never cleaned: at 1M, about half)
        "log_bytes": _du(log_dir),
    }


def _table_memory(log_dir: Path, records: int, scratch: Path) -> dict[str, Any]:
    from compactlog.table import Table

    with Table(log_dir, follow=False) as table:
        for part in table._parts:  # the dict is built in a thread of its own: wait for it
            part.thaw()
        gc.collect()
        return {"keys": len(table), "ready_rss_bytes": _rss_bytes()}  # (issue 33: peak/ready)


def _table_disk(log_dir: Path, records: int, scratch: Path) -> dict[str, Any]:
    from compactlog.table import Table

    state = scratch / "table-state"
    shutil.rmtree(state, ignore_errors=True)
    try:
        with Table(log_dir, follow=False, store="disk", state_dir=state) as table:
            return {"keys": len(table)}
    finally:
        shutil.rmtree(state, ignore_errors=True)


def _arrow_restore(log_dir: Path, records: int, scratch: Path) -> dict[str, Any]:
    from compactlog.spark.restore import restore

    out = scratch / "restored"
    shutil.rmtree(out, ignore_errors=True)
    try:
        result = restore(log_dir, out, engine="arrow", format="parquet")
        return {"rows": result.rows}
    finally:
        shutil.rmtree(out, ignore_errors=True)


KILLED_WRITER = """
import sys, compactlog
from benchmarks.bench_scale import workload
with compactlog.open(sys.argv[1]) as log:
    for number, batch in enumerate(workload(10 ** 9, seed=7)):
        log.append_batch(batch)
        if number == 20:
            print("writing", flush=True)
"""


def _reopen_after_kill(log_dir: Path, records: int, scratch: Path) -> dict[str, Any]:
    """Not timed: a writer appending batches, killed with SIGKILL once it has written a
    few. Timed (by the caller): the recovery of ``open`` and a ``close``."""
    import compactlog

    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(log_dir)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        time.sleep(0.2)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    gc.collect()
    c, w = time.process_time(), time.perf_counter()
    with compactlog.open(log_dir) as log:
        end = log.end_offset
    return {
        "cpu_s": time.process_time() - c,
        "wall_s": time.perf_counter() - w,
        "end_offset": end,
    }


STEP_FUNCTIONS: dict[str, Callable[[Path, int, Path], dict[str, Any]]] = {
    "append": _append,
    "read_batches": _read_batches,
    "read": _read,
    "compact": _compact,
    "table_memory": _table_memory,
    "table_disk": _table_disk,
    "arrow_restore": _arrow_restore,
    "reopen_after_kill": _reopen_after_kill,
}


def run_step(step: str, log_dir: Path, records: int, scratch: Path) -> dict[str, Any]:
    """One step in this process: CPU and wall seconds (the step's own, when it measures
    them itself), peak RSS, and what the step reports."""
    import resource

    # what the steps use, imported first: imports are not part of a step
    import compactlog.log
    import compactlog.restore.arrow_restore
    import compactlog.spark.restore
    import compactlog.table
    import compactlog.table.table_disk  # noqa: F401

    gc.collect()
    start_rss = _rss_bytes()
    c, w = time.process_time(), time.perf_counter()
    extra = STEP_FUNCTIONS[step](log_dir, records, scratch)
    result = {"cpu_s": time.process_time() - c, "wall_s": time.perf_counter() - w}
    result.update(extra)
    result["start_rss_bytes"] = start_rss
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["cpu_us_per_record"] = result["cpu_s"] / records * 1e6
    if result.get("records_cleaned"):
        result["cpu_us_per_record_cleaned"] = result["cpu_s"] / result["records_cleaned"] * 1e6
    return result


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# -- running the sizes -------------------------------------------------------------------


def measure_size(
    records: int, root: Path, steps: Sequence[str] = STEPS, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Every step at ``records`` records, each in a child process; the log is removed after."""
    log_dir = root / f"scale-{records}" / "log"
    scratch = log_dir.parent
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    results: dict[str, Any] = {}
    try:
        for step in steps:
            command = [sys.executable, "-m", "benchmarks.bench_scale", "--step", step]
            command += ["--log", str(log_dir), "--records", str(records)]
            done = subprocess.run(
                command, cwd=REPO_ROOT, capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise RuntimeError(f"step {step} at {records:,} records failed:\n{done.stderr}")
            results[step] = json.loads(done.stdout.strip().splitlines()[-1])
            say(f"{records:>12,} {step:<18} {_summary(results[step])}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def _summary(result: dict[str, Any]) -> str:
    return (
        f"{result['cpu_us_per_record']:8.3f} us/record CPU, {result['wall_s']:8.2f} s wall, "
        f"peak RSS {result['peak_rss_bytes'] / 1e6:,.0f} MB"
    )


def room_for(records: int, root: Path) -> bool:
    """Whether ``root``'s file system has room for a log of ``records`` and its copies."""
    return shutil.disk_usage(root).free >= records * BYTES_PER_RECORD_ON_DISK


def machine() -> dict[str, Any]:
    from .common import machine_info

    info: dict[str, Any] = dict(machine_info())
    try:
        info["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["commit"] = "unknown"
    return info


def run(
    sizes: Sequence[int],
    root: Path,
    results_path: Path,
    steps: Sequence[str] = STEPS,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure ``sizes`` and merge them into the JSON at ``results_path`` (kept sizes stay)."""
    document = load(results_path)
    document["machine"] = machine()
    document["workload"] = {
        "batch": BATCH,
        "keys": "16-24 bytes, records / 10 distinct",
        "value_bytes": VALUE_BYTES,
        "tombstones": TOMBSTONE_SHARE,
    }
    for records in sizes:
        if not room_for(records, root):
            say(f"{records:,} records: skipped, not enough free disk under {root}")
            document["sizes"][str(records)] = {"skipped": "not enough free disk"}
            continue
        document["sizes"][str(records)] = measure_size(records, root, steps, say)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return document


def load(results_path: Path) -> dict[str, Any]:
    if results_path.exists():
        document: dict[str, Any] = json.loads(results_path.read_text())
        document.setdefault("sizes", {})
        return document
    return {"sizes": {}}


# -- rendering ---------------------------------------------------------------------------


def _size_name(records: int) -> str:
    if records >= 1_000_000 and records % 1_000_000 == 0:
        return f"{records // 1_000_000}M"
    if records >= 1000 and records % 1000 == 0:
        return f"{records // 1000}k"
    return f"{records:,}"


def measured_sizes(document: dict[str, Any]) -> list[int]:
    return sorted(int(n) for n, steps in document["sizes"].items() if "skipped" not in steps)


def render_markdown(document: dict[str, Any], plot_name: str | None = None) -> str:
    """The generated section's text: setup, the table, the targets, the plot."""
    sizes = measured_sizes(document)
    info = document.get("machine", {})
    lines = [
        "Generated by `python -m benchmarks.bench_scale` (issue 33); commit "
        f"{info.get('commit', '?')}, {info.get('CPU', '?')}, {info.get('Cores', '?')} cores, "
        f"{info.get('Python', '?')}. Workload: `append_batch` in batches of 1,000, keys of "
        "16-24 bytes over N/10 keys, 100-byte values, 5% tombstones. Each cell: CPU "
        "microseconds per record (of the N appended), then wall seconds and peak RSS of the "
        "step's own process; reopen after kill -9 in seconds of CPU.",
        "",
    ]
    head = "| step | " + " | ".join(_size_name(n) for n in sizes) + " |"
    lines += [head, "|---|" + "---|" * len(sizes)]
    for step in STEPS:
        cells = []
        for records in sizes:
            result = document["sizes"][str(records)].get(step)
            cells.append("" if result is None else _cell(step, result))
        lines.append(f"| {TITLES[step]} | " + " | ".join(cells) + " |")
    skipped = [n for n, steps in document["sizes"].items() if "skipped" in steps]
    if skipped:
        names = ", ".join(_size_name(int(n)) for n in sorted(skipped, key=int))
        lines += ["", f"Not run: {names} (not enough free disk)."]
    targets = target_rows(document)
    if targets:
        lines += ["", "| target | growth | allowed | met |", "|---|---|---|---|"]
        for name, growth, allowed in targets:
            met = "yes" if growth <= allowed else "**no**"
            lines.append(f"| {name} | {growth:.2f}x | {allowed:.1f}x | {met} |")
    if plot_name and len(sizes) > 1:
        lines += ["", f"![CPU per record against size]({plot_name})"]
    return "\n".join(lines)


def _cell(step: str, result: dict[str, Any]) -> str:
    rss = f"{result['peak_rss_bytes'] / 1e6:,.0f} MB"
    if step == "reopen_after_kill":
        return f"{result['cpu_s']:.2f} s ({result['wall_s']:.2f} s wall, {rss})"
    extra = ""
    if step == "compact":
        cleaned = result.get("cpu_us_per_record_cleaned")
        passes = result["passes"]
        extra = f", {passes} pass{'' if passes == 1 else 'es'}" + (
            f", {cleaned:.2f} per record cleaned" if cleaned else ""
        )
    if "ready_rss_bytes" in result:
        extra = f", peak {result['peak_rss_bytes'] / result['ready_rss_bytes']:.2f}x ready"
    return f"{result['cpu_us_per_record']:.2f} ({result['wall_s']:,.1f} s, {rss}{extra})"


def target_rows(document: dict[str, Any]) -> list[tuple[str, float, float]]:
    """``(name, growth, allowed)`` of each target whose sizes were run: CPU per record of a
    larger size over a smaller one's, and the memory table's peak over its ready RSS."""
    rows = []
    for step, small, large, allowed in TARGETS:
        a = document["sizes"].get(str(small), {}).get(step)
        b = document["sizes"].get(str(large), {}).get(step)
        if a and b and a["cpu_us_per_record"] > 0:
            growth = b["cpu_us_per_record"] / a["cpu_us_per_record"]
            name = f"{TITLES[step]}: {_size_name(large)} / {_size_name(small)}"
            rows.append((name, growth, allowed))
            if a.get("cpu_us_per_record_cleaned") and b.get("cpu_us_per_record_cleaned"):
                growth = b["cpu_us_per_record_cleaned"] / a["cpu_us_per_record_cleaned"]
                rows.append((f"{name}, per record cleaned", growth, allowed))
    sizes = measured_sizes(document)
    table = document["sizes"][str(sizes[-1])].get("table_memory") if sizes else None
    if table and table.get("ready_rss_bytes"):
        name = f"`Table` in memory: peak RSS / ready RSS at {_size_name(sizes[-1])}"
        rows.append((name, table["peak_rss_bytes"] / table["ready_rss_bytes"], 1.3))
    return rows


def plot(document: dict[str, Any], path: Path) -> bool:
    """CPU per record against size, one line per step (log-scaled size); ``False`` when
    fewer than two sizes were measured or matplotlib is missing."""
    sizes = measured_sizes(document)
    if len(sizes) < 2:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for step in STEPS:
        if step == "reopen_after_kill":
            continue
        points = [
            (n, document["sizes"][str(n)][step]["cpu_us_per_record"])
            for n in sizes
            if step in document["sizes"][str(n)]
        ]
        if points:
            axes.plot(*zip(*points, strict=True), marker="o", label=TITLES[step].replace("`", ""))
    axes.set_xscale("log")
    axes.set_xlabel("records")
    axes.set_ylabel("CPU us per record")
    axes.set_title("Cost per record against size (flat is the goal)")
    axes.legend(fontsize="small")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def render(document: dict[str, Any], doc_path: Path, plot_path: Path) -> None:
    """Write the plot and the generated section of ``doc_path``."""
    drawn = plot(document, plot_path)
    relative = os.path.relpath(plot_path, doc_path.parent) if drawn else None
    text = doc_path.read_text() if doc_path.exists() else ""
    heading = {SECTION: "Scale: every step from 1M records up (issue 33)"}
    body = render_markdown(document, relative)
    doc_path.write_text(report_page.splice(text, {SECTION: body}, heading))


# -- the command line --------------------------------------------------------------------


def parse_size(text: str) -> int:
    text = text.strip().lower().replace("_", "")
    scale = {"k": 1000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_scale", description=__doc__)
    parser.add_argument("--sizes", default="1M,10M,50M", help="e.g. 1M,10M,50M,100M")
    parser.add_argument("--steps", default=",".join(STEPS), help="a subset, comma-separated")
    parser.add_argument("--root", type=Path, help="scratch space (default: a temporary dir)")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC)
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT)
    parser.add_argument("--render", action="store_true", help="only render the JSON into the doc")
    parser.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--log", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--records", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:  # a child: one step, its result as the last line of stdout
        scratch = args.log.parent
        result = run_step(args.step, args.log, args.records, scratch)
        print(json.dumps(result))
        return 0
    if not args.render:
        sizes = [parse_size(size) for size in args.sizes.split(",")]
        steps = [step for step in args.steps.split(",") if step]
        unknown = sorted(set(steps) - set(STEPS))
        if unknown:
            parser.error(f"unknown steps {unknown}; known: {', '.join(STEPS)}")
        with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=args.root) as root:
            run(sizes, Path(root), args.results, steps)
    render(load(args.results), args.doc, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
