"""The engine benchmark's quick mode runs and reads back what it wrote (correctness only:
no timing is asserted; performance is measured by ``make bench``, never in tests)."""

from __future__ import annotations

from pathlib import Path

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
