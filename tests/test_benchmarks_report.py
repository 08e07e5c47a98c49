"""``make bench`` rewrites only the generated sections of docs/benchmarks.md (and the figure),
each stamped with its commit and machine; the prose around them survives every run. Tested
with a fake result: the real benchmarks are run by hand on a quiet machine."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks import report_page, run

DOCS = Path(__file__).resolve().parent.parent / "docs"
INFO = {"CPU": "Fake CPU 9000", "Cores": "2 (2 usable)", "Python": "CPython 3.11.7"}


def prose_of(page: str) -> str:
    return report_page.SECTION.sub(lambda m: f"<{m.group('name')}>", page)


def bodies_of(page: str) -> dict[str, str]:
    return {m.group("name"): m.group("body") for m in report_page.SECTION.finditer(page)}


def test_make_bench_rewrites_only_the_generated_sections(tmp_path: Path):
    shutil.copy(DOCS / "benchmarks.md", tmp_path / "benchmarks.md")
    before = (tmp_path / "benchmarks.md").read_text()
    source = report_page.stamp("abc1234 (2026-11-28)", INFO)
    others = {"bench_compaction": "| Figure | Value |\n|---|---|\n| records | 7 |"}
    run.write_report(
        tmp_path, ["- CPU: Fake CPU 9000"], "| results |", "| targets |", others, True, source
    )
    after = (tmp_path / "benchmarks.md").read_text()
    assert prose_of(after) == prose_of(before)  # every hand-written word kept
    new = bodies_of(after)
    for name in ("setup", "results", "targets", "figure", "bench_compaction"):
        assert new[name].startswith(
            "_From `make bench` at commit abc1234 (2026-11-28), on Fake CPU 9000, 2 (2 usable) "
            "cores, CPython 3.11.7._\n"
        ), name
    assert "| records | 7 |" in new["bench_compaction"]
    assert new["bench_subscriber"] == bodies_of(before)["bench_subscriber"]  # not run: kept


def test_a_section_the_page_lacks_is_added_at_its_end():
    page = "# B\n\nProse.\n\n<!-- generated: a -->\nold\n<!-- end generated -->\n\nMore prose.\n"
    text = report_page.splice(page, {"a": "new", "b": "added"})
    assert text == (
        "# B\n\nProse.\n\n<!-- generated: a -->\nnew\n<!-- end generated -->\n\nMore prose.\n"
        "\n## b\n\n<!-- generated: b -->\nadded\n<!-- end generated -->\n"
    )


def test_a_new_page_gets_the_sections_and_the_method(tmp_path: Path):
    run.write_report(tmp_path, ["- x"], "| r |", "| t |", {}, False, "_stamp_")
    page = (tmp_path / "benchmarks.md").read_text()
    assert set(bodies_of(page)) == {"setup", "results", "targets"}
    assert "## Method" in page


def test_every_generated_section_of_the_docs_says_where_it_came_from():
    """Its first line names the commit and the machine (bench_scale's says so in its own
    words), or says that it was never measured."""
    bodies = bodies_of((DOCS / "benchmarks.md").read_text())
    assert {"setup", "results", "targets", "figure"} <= set(bodies)
    for name, body in bodies.items():
        first = body.splitlines()[0]
        if first.startswith("Not measured yet"):
            continue
        assert "commit " in first and " cores" in first and "Python" in first, name
