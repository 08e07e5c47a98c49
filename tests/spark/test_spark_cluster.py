"""The writer, reader, stream and ``compactlog restore --master spark://...`` on a real Spark
standalone cluster: a master and a worker started from pip ``pyspark``'s ``spark-class`` on
127.0.0.1, the log on a path the worker's executors share with the driver.

The cluster jobs run in a child process with its own driver (the test process keeps its one
local session); the master and the worker are stopped by their process ids at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq

import compactlog

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def alive_workers(ui_port: int) -> int:
    """The master's count of alive workers; 0 while its web UI is not answering JSON yet.

    Once in CI, ``/json/`` was answered with the ``/`` page's HTML, most likely while the
    master's UI was still attaching its pages; that is "not ready", as a refused connection is.
    """
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


@contextlib.contextmanager
def standalone_cluster(workdir: Path):
    """A master and one worker (2 cores, 1 GiB) on 127.0.0.1; yields the master URL."""
    import pyspark

    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    env = dict(
        os.environ,
        SPARK_HOME=os.path.dirname(pyspark.__file__),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",
        PYSPARK_PYTHON=sys.executable,
    )
    url = f"spark://127.0.0.1:{port}"
    logs = [open(workdir / name, "wb") for name in ("master.log", "worker.log")]  # noqa: SIM115
    commands = [
        [
            spark_class(),
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui_port),
        ],
        [
            spark_class(),
            "org.apache.spark.deploy.worker.Worker",
            url,
            "--host",
            "127.0.0.1",
            "--webui-port",
            str(worker_ui),
            "--cores",
            "2",
            "--memory",
            "1g",
            "--work-dir",
            str(workdir / "work"),
        ],
    ]
    processes = []
    try:
        for command, out in zip(commands, logs, strict=True):
            processes.append(subprocess.Popen(command, env=env, stdout=out, stderr=out))
        deadline = time.monotonic() + 120
        while alive_workers(ui_port) < 1:
            assert time.monotonic() < deadline, (workdir / "worker.log").read_text()[-3000:]
            assert all(p.poll() is None for p in processes), "the master or worker exited"
            time.sleep(0.5)
        yield url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for out in logs:
            out.close()


JOB = textwrap.dedent(
    """
    import json, sys
    import compactlog
    from compactlog.spark.session import local_session
    from compactlog.cli.main import main as compactlog_cli

    master, work = sys.argv[1], sys.argv[2]
    log, out, sink = work + "/log", work + "/restored", work + "/changes"
    spark = local_session(master, app_name="compactlog cluster test", config={
        "spark.executor.memory": "512m", "spark.executor.cores": "2",
        "spark.ui.showConsoleProgress": "false",
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
    with standalone_cluster(work) as url:
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
