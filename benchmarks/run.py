"""``make bench``: run every benchmark, print one table, rewrite the generated sections of
``docs/benchmarks.md`` (``report_page``: the prose around them is never touched) and the
figure ``docs/benchmarks.png``.

    python -m benchmarks.run            # full run (a few minutes on 2 cores)
    python -m benchmarks.run --quick    # small smoke run; writes under bench-data/quick

The engine workloads (``bench_engine``) always run. ``bench_compaction.run(records=...)``,
``bench_subscriber.run()``, ``bench_cleaner.run()``, ``bench_readback.run(records=...)``,
``bench_mixed_reads.run(records=records // 5)`` (issue 24: mixed appends, side by side),
``bench_jlog.run(records=...)`` (record at a time against JLog's C library, built on first
use), ``bench_spark.run(records=10 * records)`` (issue 10's 10M records in a full run) and
``bench_spark_stream.run(records=10 * records)`` (issue 11: streaming and the writer) and
``bench_arrow.run(records=...)`` (issue 19: Arrow in and out, restore engines) are added
when those modules exist and return a dict.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import bench_engine, report_page
from .common import BENCH_ROOT, REPO_ROOT, Measurement, machine_info, max_rss_bytes, scratch_root

OPTIONAL = (
    ("bench_compaction", lambda sizes: {"records": sizes.records}),
    ("bench_subscriber", lambda sizes: {}),
    ("bench_cleaner", lambda sizes: {}),
    ("bench_readback", lambda sizes: {"records": sizes.records}),
    # issue 24: single appends mixed with batches, side by side with single appends alone
    ("bench_mixed_reads", lambda sizes: {"records": sizes.records // 5}),
    ("bench_table", lambda sizes: {"records": sizes.records}),  # issue 19: tables
    ("bench_jlog", lambda sizes: {"records": sizes.records}),
    ("bench_spark", lambda sizes: {"records": sizes.records * 10}),  # issue 10: 10M records
    # issue 11: a 10M-record stream in micro-batches of 1M; the writer on 1M rows
    ("bench_spark_stream", lambda sizes: {"records": sizes.records * 10}),
    # issue 19: Arrow in and out, and restore by the Arrow engine against Spark's
    ("bench_arrow", lambda sizes: {"records": sizes.records}),
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    parser.add_argument("--repeat", type=int, help="timed repetitions per measurement")
    parser.add_argument("--warmup", type=int, help="untimed warm-up runs per measurement")
    parser.add_argument("--records", type=int, help="records for the 100-byte workloads")
    parser.add_argument("--data-dir", type=Path, help="scratch space (default ./bench-data)")
    parser.add_argument("--out-dir", type=Path, help="where benchmarks.md/.png/.json go")
    parser.add_argument("--no-optional", action="store_true", help="engine workloads only")
    return parser.parse_args(argv)


# -- formatting --------------------------------------------------------------------------


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:,.{digits}f}"


def _mib(value: int | None) -> str:
    return "" if value is None else f"{value / (1 << 20):,.1f}"


def _ratio(ours: Measurement, other: Measurement | None) -> str:
    if other is None or other is ours:
        return ""
    return f"{ours.records_per_s / other.records_per_s:.2f}x"


def _peer(measurements: list[Measurement], m: Measurement, family: str) -> Measurement | None:
    for other in measurements:
        if other.workload == m.workload and other.system.startswith(family):
            return other
    return None


def results_table(measurements: list[Measurement]) -> str:
    """One markdown table: absolute figures, then ours / SQLite and ours / raw I/O."""
    head = (
        "| Workload | System | Records | Median s | p90 s | Records/s | MB/s "
        "| Peak traced MiB | Peak RSS +MiB | Ours / SQLite | Ours / raw I/O |"
    )
    lines = [head, _rule(head)]
    for m in measurements:
        ours = m.system.startswith(bench_engine.OURS)
        lines.append(
            "| "
            + " | ".join(
                [
                    m.workload,
                    m.system,
                    _num(m.records),
                    f"{m.median:.4f}",
                    f"{m.p90:.4f}",
                    _num(m.records_per_s),
                    _num(m.mb_per_s, 1),
                    _mib(m.memory.traced if m.memory else None),
                    _mib(m.memory.rss_growth if m.memory else None),
                    _ratio(m, _peer(measurements, m, bench_engine.SQLITE)) if ours else "",
                    _ratio(m, _peer(measurements, m, bench_engine.RAW)) if ours else "",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def _rule(head: str) -> str:
    cells = head.count("|") - 1
    return "|" + "---|" * cells


def targets_table(targets: list[bench_engine.Target]) -> str:
    lines = ["| Target | Measured | Required | Met |", "|---|---|---|---|"]
    for t in targets:
        digits = 2 if t.unit == "x" else 0
        lines.append(
            f"| {t.name} | {_num(t.measured, digits)} {t.unit} | "
            f"{_num(t.required, digits)} {t.unit} | {'yes' if t.met else '**no**'} |"
        )
    return "\n".join(lines)


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for key, item in value.items():
            out.extend(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list | tuple) and value and all(isinstance(v, dict) for v in value):
        out = []
        for i, item in enumerate(value):
            out.extend(_flatten(item, f"{prefix}[{i}]"))
        return out
    return [(prefix, value)]


def _cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def other_table(figures: dict[str, Any]) -> str:
    """The figures as a table; a ``markdown`` entry (a module's own table) goes first."""
    figures = dict(figures)
    own = figures.pop("markdown", None)
    lines = [str(own), ""] if own else []
    lines += ["| Figure | Value |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in _flatten(figures)]
    return "\n".join(lines)


# -- the plot ----------------------------------------------------------------------------


def plot(measurements: list[Measurement], path: Path, source: str = "") -> bool:
    """Records/s per workload and system (log scale). False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    colours = {bench_engine.OURS: "#1f77b4", bench_engine.SQLITE: "#ff7f0e"}
    labels = [f"{m.workload} | {m.system}" for m in measurements]
    values = [m.records_per_s for m in measurements]
    colour = [
        next((c for family, c in colours.items() if m.system.startswith(family)), "#7f7f7f")
        for m in measurements
    ]
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(labels) + 1.5))
    y = list(range(len(labels)))[::-1]
    ax.barh(y, values, color=colour)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("records/s (median, log scale)")
    ax.set_title(f"compactlog (blue) vs SQLite (orange) vs raw file I/O (grey)\n{source}")
    for yi, v in zip(y, values, strict=True):
        ax.text(v, yi, f" {v:,.0f}", va="center", fontsize=7)
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# -- the report --------------------------------------------------------------------------


def header_lines(info: dict[str, str], sizes: bench_engine.Sizes, quick: bool) -> list[str]:
    lines = [f"- {key}: {value}" for key, value in info.items()]
    lines += [
        f"- Mode: {'quick (smoke run, figures meaningless)' if quick else 'full'}",
        f"- Records: {sizes.records:,} x (16 B key + 100 B value) in batches of {sizes.batch:,}; "
        f"{sizes.large_records:,} x (16 B + {sizes.large_value:,} B); "
        f"{sizes.threads} threads x {sizes.sync_appends:,} synced appends; "
        f"{sizes.precommit_records:,} precommit appends "
        f"({sizes.single_records:,} for the slower single-record rows)",
        f"- Repetitions: {sizes.warmup} warm-up + {sizes.repeat} timed per row "
        "(median and p90 of the times), then 1 untimed run for peak memory",
    ]
    return lines


METHOD = """\
How to read this:

- Every row is one system doing the same work on the same data; Records/s and MB/s come
  from the median time. MB/s counts the bytes of the encoded compactlog batches for every
  system of a workload (the on-disk size of the data), so MB/s ratios equal time ratios.
- Timings exclude setup and teardown: opening, closing and its final fsync, and building
  the inputs (SQLite gets its row tuples ready-made, which favours it slightly).
- `sync="os"` appends and SQLite's `synchronous=NORMAL` leave durability to the kernel;
  raw I/O is a buffered Python `write` (or `readinto`) of the same bytes: the practical
  limit of this machine's page cache, not of its disk.
- Peak traced MiB is `tracemalloc`'s peak during the timed part (Python and numpy memory,
  not SQLite's C heap); Peak RSS +MiB is how far the process's resident set rose above its
  level at the start of that part (every allocation, mapped file pages included).
- The machine has 2 cores and other work (tests of other engineers) ran at the same time,
  so figures are noisy: compare ratios taken in the same run rather than absolute numbers
  across runs.
"""


def write_report(
    out_dir: Path,
    lines_header: list[str],
    table: str,
    targets: str,
    others: dict[str, str],
    plotted: bool,
    source: str,
) -> Path:
    """Rewrite the generated sections of ``out_dir/benchmarks.md``, each opening with
    ``source`` (commit and machine); a new page also gets the method."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sections = {"setup": "\n".join(lines_header), "results": table, "targets": targets}
    if plotted:
        sections["figure"] = "![records/s per workload](benchmarks.png)"
    sections.update(others)
    path = out_dir / "benchmarks.md"
    if not path.exists():
        path.write_text(f"{report_page.NEW_PAGE}\n## Method\n\n{METHOD}", encoding="utf-8")
    report_page.update_page(path, {k: f"{source}\n\n{v}" for k, v in sections.items()})
    return path


def run_optional(
    sizes: bench_engine.Sizes, say: Callable[[str], None]
) -> dict[str, dict[str, Any] | str]:
    """Figures from the other benchmark modules that exist; an error text if one failed."""
    found: dict[str, dict[str, Any] | str] = {}
    for name, kwargs in OPTIONAL:
        try:
            module = importlib.import_module(f"benchmarks.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"benchmarks.{name}":
                found[name] = f"could not import: {error}"
            continue
        runner = getattr(module, "run", None)
        if not callable(runner):
            continue
        say(f"{name}.run()")
        try:
            result = runner(**kwargs(sizes))
        except Exception:
            found[name] = "failed: " + traceback.format_exc(limit=3).strip().splitlines()[-1]
            say(f"  {found[name]}")
            continue
        if isinstance(result, dict):
            found[name] = result
        else:
            found[name] = f"run() returned {type(result).__name__}, not a dict"
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = bench_engine.QUICK if args.quick else bench_engine.Sizes()
    changes = {
        k: v
        for k, v in (("repeat", args.repeat), ("warmup", args.warmup), ("records", args.records))
        if v is not None
    }
    sizes = replace(sizes, **changes)
    out_dir = args.out_dir or (BENCH_ROOT / "quick" if args.quick else REPO_ROOT / "docs")
    info = machine_info()
    lines_header = header_lines(info, sizes, args.quick)
    print("compactlog benchmarks")
    print("\n".join(lines_header))
    print()
    started = time.perf_counter()
    with scratch_root(args.data_dir) as root:
        results = bench_engine.run(root, sizes)
    others = {} if args.no_optional else run_optional(sizes, print)
    elapsed = time.perf_counter() - started
    peak_rss = max_rss_bytes() / (1 << 20)
    lines_header.append(
        f"- Whole run: {elapsed:,.0f} s; peak RSS of the process {peak_rss:,.0f} MiB"
    )

    table = results_table(results.measurements)
    targets = targets_table(results.targets)
    other_tables = {
        name: other_table(value) if isinstance(value, dict) else str(value)
        for name, value in others.items()
    }
    print()
    print(table)
    print()
    print(targets)
    for name, text in other_tables.items():
        print(f"\n### {name}\n\n{text}")

    out_dir.mkdir(parents=True, exist_ok=True)
    source = report_page.stamp(report_page.commit_of(REPO_ROOT), info)
    plotted = plot(results.measurements, out_dir / "benchmarks.png", source.strip("_"))
    report = write_report(out_dir, lines_header, table, targets, other_tables, plotted, source)
    raw = {
        "setup": info,
        "sizes": sizes.__dict__,
        "measurements": [m.as_dict() for m in results.measurements],
        "targets": [t.as_dict() for t in results.targets],
        "others": others,
    }
    (out_dir / "benchmarks.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    print(f"\nwrote {report}" + (" and benchmarks.png" if plotted else " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
