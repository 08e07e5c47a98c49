"""The writer, reader, stream and ``compactlog restore --master spark://...`` on a real Spark
standalone cluster: a master and a worker started from pip ``pyspark``'s ``spark-class`` on
127.0.0.1, the log on a path the worker's executors share with the driver.

The cluster jobs run in a child process with its own driver (the test process keeps its one
local session); the master and the worker are stopped by their process ids at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq

import compactlog

from .cluster import REPO, standalone_cluster

JOB = textwrap.dedent(
    """
    import json, sys
    import compactlog
    from compactlog.spark.session import local_session
    from tests.spark.cluster import QUICK_JVM_CONF
    from compactlog.cli.main import main as compactlog_cli

    master, work = sys.argv[1], sys.argv[2]
    log, out, sink = work + "/log", work + "/restored", work + "/changes"
    spark = local_session(master, app_name="compactlog cluster test", config={
        "spark.executor.memory": "512m", "spark.executor.cores": "2",
        "spark.ui.showConsoleProgress": "false", **QUICK_JVM_CONF,
    })
    result = {"master": spark.sparkContext.master}

    # the writer: executors stage, the driver appends
    df = spark.range(0, 3000, numPartitions=3).selectExpr(
        "cast(concat('k', id % 100) as binary) as key", "cast(string(id) as binary) as value")
    df.write.format("compactlog").mode("append").save(log)
    with compactlog.open(log, min_compaction_lag_ms=0) as opened:
        result["end"] = opened.end_offset
        opened.compact(force=True)

    # the batch reader
    result["latest"] = spark.read.format("compactlog").load(log).count()

    # the stream, to a Parquet sink
    query = (spark.readStream.format("compactlog").option("mode", "changelog")
             .option("maxRecordsPerTrigger", 2000).load(log)
             .writeStream.format("parquet").option("path", sink)
             .option("checkpointLocation", work + "/checkpoint")
             .trigger(availableNow=True).start())
    query.awaitTermination()
    result["stream_batches"] = len(query.recentProgress)

    # compactlog restore --master spark://... (the CLI, reusing this driver's session)
    try:
        compactlog_cli(["restore", log, "--to", out, "--master", master, "--json"])
    except SystemExit as exit:
        result["restore_exit"] = exit.code or 0
    spark.stop()
    print("RESULT " + json.dumps(result))
    """
)


def test_writer_reader_stream_and_restore_on_a_standalone_cluster(tmp_path):
    work = tmp_path / "shared"
    (work / "work").mkdir(parents=True)
    with standalone_cluster(work) as cluster:
        url = cluster.url
        done = subprocess.run(
            [sys.executable, "-c", JOB, url, str(work)],
            capture_output=True,
            text=True,
            timeout=420,
            env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(REPO)),
        )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["master"] == url
    assert result["end"] == 3000
    assert result["latest"] == 100
    assert result.get("restore_exit", 0) == 0
    assert result["stream_batches"] >= 2  # 3000 offsets, at most 2000 per micro-batch
    streamed = pq.read_table(work / "changes").to_pylist()
    with compactlog.open(work / "log", read_only=True) as log:
        in_log = {r.offset for r in log.read()}
    assert in_log <= {r["offset"] for r in streamed}
    restored = pq.read_table(work / "restored").to_pylist()
    assert {bytes(r["key"]) for r in restored} == {b"k%d" % i for i in range(100)}
    assert {bytes(r["key"]): bytes(r["value"]) for r in restored} == {
        b"k%d" % i: b"%d" % (2900 + i) for i in range(100)
    }
    # the executors really ran on the worker: it has an application directory
    assert any((work / "work").iterdir())
