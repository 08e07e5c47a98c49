"""docs/spark.md, executed (tests/docs_runner.py) with the suite's one SparkSession: the
page's ``getOrCreate()`` returns it, and it has called ``compactlog.spark.register``.

Its JVM started in the directory pytest runs in, not in the page's directory: the page's
examples give Spark absolute paths (``DATA``), as the page tells its readers to."""

from __future__ import annotations

from pathlib import Path

from tests.docs_runner import ROOT, run_page
from tests.test_docs import SETUPS


def test_the_spark_page_runs_as_written(spark, tmp_path: Path):
    def stop_streams() -> None:  # §5 starts a stream that runs until stopped
        for query in spark.streams.active:
            query.stop()

    try:
        run_page(ROOT / "docs" / "spark.md", tmp_path, SETUPS, after_block=stop_streams)
    finally:
        stop_streams()
