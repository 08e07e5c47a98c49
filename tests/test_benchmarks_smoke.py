"""The engine benchmark's quick mode runs and reads back what it wrote (correctness only:
no timing is asserted; performance is measured by ``make bench``, never in tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_engine, run


def test_engine_benchmark_quick_mode_checks_its_own_data(tmp_path: Path) -> None:
    sizes = bench_engine.quick_sizes(records=3000, large_records=1000, precommit_records=2000)
    results = bench_engine.run(tmp_path, sizes, log=lambda line: None)
    systems = {(m.workload, m.system) for m in results.measurements}
    assert len(systems) == len(results.measurements) >= 15
    for m in results.measurements:
        assert m.records > 0 and len(m.times) == sizes.repeat
        assert all(t > 0 for t in m.times)
    assert {t.name for t in results.targets} >= {"append_batch", "read_batches full scan"}
    assert list(tmp_path.iterdir()) == []  # every trial cleaned up after itself


def test_runner_quick_mode_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--quick", "--no-optional", "--data-dir", str(tmp_path / "data"), "--out-dir", str(out)]
    assert run.main(argv) == 0
    report = (out / "benchmarks.md").read_text()
    assert "| Workload | System |" in report and "SQLite" in report
    assert (out / "benchmarks.json").exists()


def test_jlog_benchmark_runs_without_jlog_and_says_why(tmp_path: Path, monkeypatch) -> None:
    from benchmarks import bench_jlog

    def unavailable(cache=None):
        raise bench_jlog.JLogUnavailable("no C compiler (test)")

    monkeypatch.setattr(bench_jlog, "build_jlog", unavailable)
    result = bench_jlog.run(records=500, root=tmp_path, say=lambda line: None)
    table = result["markdown"]
    assert "| write, default durability | n/a |" in table
    assert "JLog unavailable: no C compiler (test)" in table
    assert result["write: append() default"] > 0 and result["write: JLog default"] is None
    assert result["read: read() of single appends"] > 0  # every other row ran
    assert list(tmp_path.iterdir()) == []


def test_jlog_benchmark_against_the_real_library_when_it_is_built(tmp_path: Path) -> None:
    from benchmarks import bench_jlog

    if not (bench_jlog.cache_dir() / "libjlog.so").exists():
        pytest.skip("libjlog.so not built (make bench builds it on first use)")
    result = bench_jlog.run(records=500, root=tmp_path, say=lambda line: None)
    assert result["jlog"] == "built"
    assert result["read: JLog"] > 0  # it read back all 500 records (checked inside)


def test_table_benchmark_checks_what_each_system_built(tmp_path: Path) -> None:
    from benchmarks import bench_table

    result = bench_table.run(
        records=2000, repeat=1, latency_samples=3, root=str(tmp_path), say=lambda line: None
    )
    assert set(result["summary"]) >= {"Table restore", "latest_batches()", "follow latency"}
    disk = bench_table.run_disk(3000, root=str(tmp_path), say=lambda line: None)
    assert disk["get_per_s"] > 0 and disk["restart_10k_s"] > 0


def test_mixed_reads_benchmark_compares_every_pattern_side_by_side(tmp_path: Path) -> None:
    from benchmarks import bench_mixed_reads

    patterns = bench_mixed_reads.PATTERNS[:2] + bench_mixed_reads.PATTERNS[-1:]
    result = bench_mixed_reads.run(
        records=2000, repeat=1, root=str(tmp_path), patterns=patterns, say=lambda line: None
    )
    assert [row["pattern"] for row in result["patterns"]] == [p.name for p in patterns]
    for row in result["patterns"]:  # every scan of both logs ran and read every record
        for scan in ("read_batches", "read", "latest", "Table restore"):
            assert row[f"{scan} single"] > 0 and row[f"{scan} mixed"] > 0
    assert set(result["compaction_seconds"]) == {"single", "mixed"}
    assert "| Pattern |" in result["markdown"]
    assert list(tmp_path.iterdir()) == []


def test_follow_benchmark_counts_every_change_and_the_longest_get(tmp_path: Path) -> None:
    from benchmarks import bench_follow

    out = bench_follow.run(
        1, 2000, 0.5, keys=100, values="json", root=str(tmp_path), say=lambda line: None
    )
    assert out["written"] > 0 and out["changes"] == out["written"]
    assert out["behind_at_stop"] >= 0 and out["latency_ms"]["p99"] >= 0
    got = bench_follow.get_during_apply(2000, "disk", root=str(tmp_path))
    assert got["longest_get_ms"] >= 0


def test_scale_benchmark_runs_every_step_and_renders_its_section(tmp_path: Path) -> None:
    """``bench_scale`` at a tiny size: every step runs in its own process and checks out
    against a model of the workload; the doc's generated section is replaced in place, with
    the table, the targets and the plot (correctness only: no timing is asserted)."""
    from benchmarks import bench_scale

    model: dict[bytes, bytes] = {}
    for batch in bench_scale.workload(20_000):
        for key, value in batch:
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
    data = tmp_path / "data"
    data.mkdir()
    document = bench_scale.run([20_000], data, tmp_path / "scale.json", say=lambda line: None)
    steps = document["sizes"]["20000"]
    assert list(steps) == list(bench_scale.STEPS)
    for result in steps.values():
        assert result["cpu_s"] > 0 and result["wall_s"] > 0 and result["peak_rss_bytes"] > 0
    assert steps["append"]["end_offset"] == 20_000
    assert steps["read_batches"]["records_read"] == steps["read"]["records_read"] == 20_000
    assert steps["compact"]["passes"] >= 1
    assert steps["table_memory"]["keys"] == steps["table_disk"]["keys"] == len(model)
    assert 0 < steps["table_memory"]["ready_rss_bytes"] <= steps["table_memory"]["peak_rss_bytes"]
    assert steps["arrow_restore"]["rows"] == len(model)
    assert steps["reopen_after_kill"]["end_offset"] > 20_000  # the killed writer's batches
    assert list(data.iterdir()) == []  # each size's log removed after its steps
    assert bench_scale.load(tmp_path / "scale.json")["sizes"]["20000"] == steps

    for size in ("1000000", "10000000", "50000000"):  # more sizes: the targets and plot render
        document["sizes"][size] = steps
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\n<!-- generated: bench_scale -->\nold\n<!-- end generated -->\n\nafter\n")
    bench_scale.render(document, doc, tmp_path / "scale.png")
    text = doc.read_text()
    assert "old" not in text and text.endswith("<!-- end generated -->\n\nafter\n")
    assert "| `read()` | " in text and "| 20k | 1M | 10M | 50M |" in text
    assert "| compaction until clean: 50M / 1M | 1.00x | 1.3x | yes |" in text
    assert "| `Table` in memory: peak RSS / ready RSS at 50M | " in text
    assert "![CPU per record against size](scale.png)" in text
    assert (tmp_path / "scale.png").stat().st_size > 0
