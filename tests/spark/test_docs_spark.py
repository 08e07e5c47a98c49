"""docs/spark.md, executed (tests/docs_runner.py) with the suite's one SparkSession: the
page's ``getOrCreate()`` returns it, and it has called ``compactlog.spark.register``."""

from __future__ import annotations

from pathlib import Path

from tests.docs_runner import ROOT, run_page
from tests.test_docs import SETUPS


def test_the_spark_page_runs_as_written(spark, tmp_path: Path):
    try:
        run_page(ROOT / "docs" / "spark.md", tmp_path, SETUPS)
    finally:
        for query in spark.streams.active:  # the page starts a stream it never stops
            query.stop()
