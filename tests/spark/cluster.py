"""A real Spark standalone cluster for tests: a master and a worker started from pip
``pyspark``'s ``spark-class`` on 127.0.0.1 (tests/spark/test_spark_cluster.py, and
tests/archive/test_spark_cluster_archive.py with a worker that shares no disk with the log).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # on the children's PYTHONPATH

# Every JVM of a test cluster (master, worker, driver, executors) compiles with C1 only and
# collects with one thread: their start costs ~40% less CPU (a local session started in 19-22 s
# instead of 31-37 s here at a load of 10 on 2 cores), and the jobs are too small to gain from C2.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUICK_JVM_CONF = {
    "spark.driver.extraJavaOptions": QUICK_JVM,
    "spark.executor.extraJavaOptions": QUICK_JVM,
}


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


@dataclass(frozen=True)
class Cluster:
    url: str  # spark://127.0.0.1:PORT
    worker_pid: int  # of the worker's JVM (or of what ``worker_prefix`` execs into it)
    work_dir: Path  # the worker's --work-dir: an ``app-*`` directory per application


@contextlib.contextmanager
def standalone_cluster(
    workdir: Path, *, worker_prefix: Sequence[str] = (), worker_env: dict[str, str] | None = None
) -> Iterator[Cluster]:
    """A master and one worker (2 cores, 1 GiB) on 127.0.0.1, stopped by their process ids.

    ``worker_prefix`` runs before the worker's command and must exec it (e.g. ``unshare``
    into a mount namespace of its own); ``worker_env`` is added to the worker's environment
    only (its executors inherit it)."""
    import pyspark

    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    env = dict(
        os.environ,
        SPARK_HOME=os.path.dirname(pyspark.__file__),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",
        SPARK_DAEMON_JAVA_OPTS=QUICK_JVM,
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
    commands[1] = [*worker_prefix, *commands[1]]
    envs = [env, {**env, **(worker_env or {})}]
    processes = []
    try:
        for command, process_env, out in zip(commands, envs, logs, strict=True):
            processes.append(subprocess.Popen(command, env=process_env, stdout=out, stderr=out))
        deadline = time.monotonic() + 120
        while alive_workers(ui_port) < 1:
            assert time.monotonic() < deadline, (workdir / "worker.log").read_text()[-3000:]
            assert all(p.poll() is None for p in processes), "the master or worker exited"
            time.sleep(0.5)
        yield Cluster(url, processes[1].pid, workdir / "work")
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
