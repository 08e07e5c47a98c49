"""A Spark standalone cluster whose worker shares no disk with the log restores a table from
the log's archive in S3 (SeaweedFS): issue 26, part 5.

The worker runs in a mount namespace of its own with a tmpfs over the directory that held
the log (and the log is deleted before the reads anyway), with its own ``TMPDIR``, so its
executors can only fetch the archive's objects from the store, with the ``AWS_*`` settings of
the worker's environment. A driver in a child process reads ``load(s3://...)`` (latest,
changelog, ``asOfOffset``) and runs ``compactlog restore s3://... --master spark://...``;
everything equals a latest-per-key model and the Arrow engine's table of the same manifest.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq
import pytest

from compactlog.archive import open_store
from compactlog.archive.push import push_once
from compactlog.restore.archive_read import CACHE_NAME
from compactlog.spark.restore import restore

from ..spark.cluster import REPO, standalone_cluster
from .helpers import Model, new_log, records_of
from .seaweed import ACCESS_KEY, SECRET_KEY

UNSHARE = ["unshare", "--mount", "--propagation", "private"]

JOB = textwrap.dedent(
    """
    import json, sys
    from compactlog.cli.main import main as compactlog_cli
    from compactlog.spark.session import local_session
    from tests.spark.cluster import QUICK_JVM_CONF

    master, url, as_of, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    spark = local_session(master, app_name="compactlog archive on a cluster", config={
        "spark.executor.memory": "512m", "spark.executor.cores": "2",
        "spark.ui.showConsoleProgress": "false", **QUICK_JVM_CONF,
    })
    read = lambda: spark.read.format("compactlog")  # a reader keeps its options: one each
    rows = lambda df: sorted([r.offset, r.key.hex(), r.value.hex()] for r in df.collect())
    result = {
        "master": spark.sparkContext.master,
        "latest": rows(read().option("numPartitions", 3).load(url)),
        "old": rows(read().option("asOfOffset", as_of).load(url)),
        "changelog": sorted(
            [r.offset, r.key.hex(), None if r.deleted else r.value.hex()]
            for r in read().option("mode", "changelog").load(url).collect()
        ),
    }
    for name in ("restore", "again"):  # the second finds the archive has not moved
        try:
            compactlog_cli(["restore", url, "--to", out, "--master", master, "--json"])
        except SystemExit as exit:
            result[name + "_exit"] = exit.code or 0
    spark.stop()
    print("RESULT " + json.dumps(result))
    """
)


def unshare_refusal() -> str | None:
    """Why this machine cannot give the worker a mount namespace of its own, or ``None``."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    done = subprocess.run(
        [*UNSHARE, "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True, text=True
    )
    if done.returncode != 0:
        return f"unshare --mount with a tmpfs is refused here: {done.stderr.strip()}"
    return None


def test_a_worker_sharing_no_disk_with_the_log_restores_it_from_s3(tmp_path, seaweed, s3_url):
    refusal = unshare_refusal()
    if refusal is not None:
        pytest.skip(refusal)
    private, shared = tmp_path / "private", tmp_path / "shared"
    (shared / "work").mkdir(parents=True)
    (shared / "worker-tmp").mkdir()
    # a log with overwrites and tombstones, compacted, archived twice, then deleted
    rng = random.Random(26)
    model = Model()
    source = private / "log"
    log = new_log(source)
    model.append(log, rng, 400)
    log.close()
    first = push_once(str(source), open_store(s3_url)).end_offset
    log = new_log(source)
    model.append(log, rng, 400)
    log.compact(force=True)
    model.append(log, rng, 100)
    log.close()
    last = push_once(str(source), open_store(s3_url))
    assert last.manifest is not None and last.manifest.sequence == 1
    changelog = records_of(source)
    shutil.rmtree(private)
    private.mkdir()  # the worker's tmpfs goes over it

    hide = 'mount -t tmpfs compactlog-hidden "$0" && exec "$@"'
    with standalone_cluster(
        shared,
        worker_prefix=[*UNSHARE, "sh", "-c", hide, str(private)],
        worker_env={**seaweed.env, "TMPDIR": str(shared / "worker-tmp")},
    ) as cluster:
        with open(f"/proc/{cluster.worker_pid}/mountinfo") as mounts:
            assert f" {private} " in mounts.read()  # the worker sees a tmpfs there
        done = subprocess.run(
            [sys.executable, "-c", JOB, cluster.url, s3_url, str(first), str(shared / "spark")],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, **seaweed.env, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(REPO)),
        )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["master"] == cluster.url

    latest = {bytes.fromhex(k): bytes.fromhex(v) for _, k, v in result["latest"]}
    assert latest == model.state()
    old = {bytes.fromhex(k): bytes.fromhex(v) for _, k, v in result["old"]}
    assert old == model.state(first)
    assert result["changelog"] == sorted(
        [o, k.hex(), None if v is None else v.hex()] for o, k, v in changelog
    )

    # compactlog restore URL --master: the same table as the Arrow engine's of that manifest
    assert result["restore_exit"] == 0 and result["again_exit"] == 0
    record = json.loads((shared / "spark" / "_compactlog.json").read_text())
    assert record["source"] == s3_url and record["engine"] == "spark"
    assert record["archive_sequence"] == 1 and record["end_offset"] == last.end_offset
    assert '"skipped": true' in done.stdout  # the second run: the archive had not moved
    arrow = restore(s3_url, shared / "arrow", engine="arrow")
    assert arrow.end_offset == record["end_offset"] and arrow.rows == record["rows"]
    tables = [pq.read_table(shared / name).sort_by("offset") for name in ("spark", "arrow")]
    assert tables[0].to_pylist() == tables[1].to_pylist()
    assert {r["key"]: r["value"] for r in tables[0].to_pylist()} == model.state()

    # the executors ran on the worker and fetched the segments from the store themselves
    assert any(p.name.startswith("app-") for p in cluster.work_dir.iterdir())
    fetched = list((shared / "worker-tmp" / CACHE_NAME).rglob("*.log"))
    assert fetched, "the worker's executors fetched no segment"
    assert not any(private.iterdir())  # and wrote nothing where the log was


def test_the_pickled_plan_of_an_archive_read_holds_no_credential(tmp_path, seaweed, s3_url):
    """What Spark ships to the executors (the options and the plan) names the URL and the
    manifest; the key pair and the endpoint stay in each process's environment."""
    from pyspark import cloudpickle

    from compactlog.restore.options import parse_options
    from compactlog.restore.plan import plan_read

    log = new_log(tmp_path / "log")
    Model().append(log, random.Random(3), 200)
    log.close()
    push_once(str(tmp_path / "log"), open_store(s3_url))
    options = parse_options({"path": s3_url})
    shipped = cloudpickle.dumps((options, plan_read(options)))
    assert s3_url.encode() in shipped
    for secret in (ACCESS_KEY, SECRET_KEY, seaweed.endpoint):
        assert secret.encode() not in shipped, secret
