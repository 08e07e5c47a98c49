"""``compactlog archive ...`` as operators run it: installed script, subprocesses, exit codes."""

from __future__ import annotations

import json
import queue
import random
import signal
import subprocess
import threading
import time

import pytest

import compactlog

from ..test_cli import SCRIPT, one_error_line, run
from .helpers import Model, new_log, state_of


@pytest.fixture
def source(tmp_path):
    rng = random.Random(51)
    log = new_log(tmp_path / "source")
    model = Model()
    model.append(log, rng, 300)
    log.compact(force=True)
    model.append(log, rng, 100)
    log.close()
    return tmp_path / "source", model


def test_push_list_verify_restore_prune(tmp_path, source, s3_url):
    path, model = source
    pushed = json.loads(run("archive", "push", path, s3_url, "--json").stdout)
    assert pushed["committed"] == 0 and pushed["new_generation"] is True
    listed = json.loads(run("archive", "list", s3_url, "--json").stdout)
    assert [m["end_offset"] for m in listed["manifests"]] == [pushed["end_offset"]]
    assert listed["lease"]["expires_ms"] == 0  # released by push
    assert "0 " in run("archive", "list", s3_url).stdout
    assert json.loads(run("archive", "verify", s3_url, "--json").stdout)["ok"] is True
    restored = json.loads(run("archive", "restore", s3_url, tmp_path / "r", "--json").stdout)
    assert restored["end_offset"] == pushed["end_offset"]
    assert state_of(tmp_path / "r") == model.state()
    again = run("archive", "restore", s3_url, tmp_path / "r", check=1)
    assert "not empty" in again.stderr and "Traceback" not in again.stderr
    pruned = json.loads(run("archive", "prune", s3_url, "--retention", "0s", "--json").stdout)
    assert pruned["retained"] == [0]


def test_as_of_options_follow_and_bad_usage(tmp_path, source):
    path, _model = source
    url = f"file://{tmp_path}/archive"
    run("archive", "push", path, url)
    listed = json.loads(run("archive", "list", url, "--json").stdout)["manifests"]
    ends = [m["end_offset"] for m in listed]
    done = run("archive", "restore", url, tmp_path / "a", "--as-of-offset", ends[0], "--json")
    assert json.loads(done.stdout)["end_offset"] == ends[0]
    early = run("archive", "restore", url, tmp_path / "b", "--as-of-time", "2001-01-01", check=1)
    assert "no retained manifest at or before time" in early.stderr
    run("archive", "follow", url, tmp_path / "replica", "--once")  # a replica readers open
    assert state_of(tmp_path / "replica") == _model.state()
    for args in (
        ("archive", "prune", url, "--retention", "soon"),
        ("archive", "restore", url, tmp_path / "c", "--as-of-time", "yesterday"),
        ("archive", "push", path, "ftp://x/y"),
    ):
        result = run(*args, check=None)
        assert result.returncode in (1, 2), args
        assert "Traceback" not in result.stderr, args
    assert run("archive", "run", path, url, "--interval", "5", check=2).stderr.count("unit") == 1


def first_line(process: subprocess.Popen, timeout_s: float) -> str:
    """The first line ``process`` prints, read in a thread so that a hang fails the test."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        process.kill()
        raise AssertionError(f"no output in {timeout_s} s: {process.communicate()[1]}") from None


def test_run_until_sigterm_commits_what_is_durable_and_exits_0(tmp_path, s3_url):
    rng = random.Random(52)
    path = tmp_path / "source"
    log = new_log(path)
    model = Model()
    model.append(log, rng, 50)
    process = subprocess.Popen(
        [SCRIPT, "archive", "run", str(path), s3_url, "--interval", "0.2s", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # the first commit says the command is running (its SIGTERM handler is set before the
    # first round): a fixed sleep lost the race under load, and SIGTERM killed it
    first = first_line(process, timeout_s=120)
    assert json.loads(first)["event"] == "commit", first
    for _ in range(5):
        model.append(log, rng, 40)
        time.sleep(0.1)
    log.flush()
    end = log.end_offset
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    events = [json.loads(line) for line in [first, *out.splitlines()]]
    assert events[-1]["event"] == "stopped"
    assert events[-1]["end_offset"] == end  # the last round committed everything durable
    assert any(e["event"] == "commit" for e in events)
    log.close()
    run("archive", "restore", s3_url, tmp_path / "r")
    assert state_of(tmp_path / "r") == model.state()


def test_a_second_archiver_is_refused_naming_the_holder(tmp_path, source):
    path, _model = source
    url = f"file://{tmp_path}/archive"
    process = subprocess.Popen(
        [SCRIPT, "archive", "run", str(path), url, "--interval", "0.1s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            listed = json.loads(run("archive", "list", url, "--json").stdout)
            if listed["manifests"]:
                break
            time.sleep(0.1)
        refused = run("archive", "push", path, url, check=1)
        assert f"pid {process.pid}" in refused.stderr and "since" in refused.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def test_restore_to_parquet_straight_from_an_archive(tmp_path, source, s3_url):
    import pyarrow.parquet as pq

    path, model = source
    run("archive", "push", path, s3_url)
    out = tmp_path / "out.parquet"
    done = json.loads(run("restore", s3_url, "--to", out, "--engine", "arrow", "--json").stdout)
    assert done["rows"] == len(model.state())
    table = pq.read_table(out)
    got = dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))
    assert got == model.state()
    # the record names the archive and its manifest; the archive has not moved: nothing to do
    record = json.loads((out / "_compactlog.json").read_text())
    assert record["source"] == s3_url and record["archive_sequence"] == 0
    assert record["end_offset"] == done["end_offset"]
    again = json.loads(run("restore", s3_url, "--to", out, "--engine", "arrow", "--json").stdout)
    assert again["skipped"] is True and again["rows"] == done["rows"]
    # a new manifest with new records moves it
    log = compactlog.open(path)
    model.append(log, random.Random(5), 50)
    log.close()
    run("archive", "push", path, s3_url)
    moved = json.loads(run("restore", s3_url, "--to", out, "--engine", "arrow", "--json").stdout)
    assert moved["skipped"] is False and moved["archive_sequence"] == 1
    assert moved["end_offset"] > done["end_offset"]
    table = pq.read_table(out)
    got = dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))
    assert got == model.state()


def test_restore_refuses_a_url_that_is_no_archive_and_an_empty_archive(tmp_path, s3_url):
    unknown = one_error_line(run("restore", "ftp://host/logs", "--to", tmp_path / "o", check=2))
    assert "unsupported URL scheme 'ftp'" in unknown and "s3://" in unknown
    plain = one_error_line(run("restore", f"file://{tmp_path}", "--to", tmp_path / "o", check=2))
    assert "no manifests/" in plain and "plain path" in plain
    for engine in ("arrow", "spark"):
        empty = run("restore", s3_url, "--to", tmp_path / "o", "--engine", engine, check=1)
        assert "the archive holds no manifest" in one_error_line(empty)
    assert not (tmp_path / "o").exists()
