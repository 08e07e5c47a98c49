"""The archive run by an operator: store errors that say what to check, loops that outlive
a failing store, and the CLI's edges (order of arguments, floors, lag, list). Installed
script, subprocesses, SeaweedFS and the loopback proxy, as operators meet them."""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import threading
import time

import pytest

from ..test_cli import SCRIPT, one_error_line, run
from .helpers import Model, new_log, state_of
from .proxy import FaultyProxy
from .seaweed import BUCKET


@pytest.fixture
def source(tmp_path):
    rng = random.Random(61)
    log = new_log(tmp_path / "source")
    model = Model()
    model.append(log, rng, 200)
    log.close()
    return tmp_path / "source", model


def run_with(env: dict[str, str | None], *args: object, check: int | None = 1):
    """``compactlog ARGS`` with ``env`` changed (``None`` removes a variable)."""
    merged = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    for name, value in env.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    result = subprocess.run(
        [SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=120, env=merged
    )
    if check is not None:
        assert result.returncode == check, (result.stdout, result.stderr)
    return result


def test_store_errors_are_one_line_naming_url_operation_code_and_setting(seaweed):
    missing = one_error_line(run_with({}, "archive", "list", "s3://no-such-bucket-x/p"))
    assert "s3://no-such-bucket-x/p" in missing and "list manifests/" in missing
    assert "NoSuchBucket" in missing and "check the bucket in the URL" in missing
    wrong = one_error_line(
        run_with({"AWS_SECRET_ACCESS_KEY": "wrong"}, "archive", "list", f"s3://{BUCKET}/p")
    )
    assert "SignatureDoesNotMatch" in wrong and "AWS_SECRET_ACCESS_KEY" in wrong
    refused = one_error_line(
        run_with({"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "archive", "verify", "s3://b/p")
    )
    assert "cannot reach the server" in refused and "AWS_ENDPOINT_URL" in refused


def test_endpoint_and_credentials_are_checked_before_any_request(seaweed):
    bare = seaweed.endpoint.removeprefix("http://")
    no_scheme = run_with({"AWS_ENDPOINT_URL": bare}, "archive", "list", f"s3://{BUCKET}/p")
    line = one_error_line(no_scheme)  # was a PanicException and its traceback
    assert f"AWS_ENDPOINT_URL='{bare}' is not an endpoint URL" in line
    assert f"http://{bare}" in line
    plain = run_with({"AWS_ALLOW_HTTP": None}, "archive", "list", f"s3://{BUCKET}/p")
    assert "set AWS_ALLOW_HTTP=true" in one_error_line(plain)  # was "builder error"
    nothing = run_with(
        {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None},
        "archive",
        "list",
        f"s3://{BUCKET}/p",
    )
    line = one_error_line(nothing)
    assert "no credentials" in line and "169.254" not in line  # no metadata service asked
    public = run_with(
        {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SKIP_SIGNATURE": "true"},
        "archive",
        "list",
        f"s3://{BUCKET}/p",
        check=None,
    )
    assert "no credentials" not in public.stderr  # a public bucket asks for none


def test_help_names_the_aws_variables():
    for args in (
        ("archive", "--help"),
        ("archive", "run", "--help"),
        ("archive", "follow", "--help"),
    ):
        text = run(*args).stdout
        for name in ("AWS_ACCESS_KEY_ID", "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_REGION"):
            assert name in text, (args, name)


def lines_of(process: subprocess.Popen) -> queue.Queue[str]:
    """Every line ``process`` prints, read by a thread (a hang fails the test, not CI)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def wait_for(lines: queue.Queue[str], event: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            document = json.loads(lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
        except queue.Empty:
            break
        if document.get("event", "applied") == event:
            return document
    raise AssertionError(f"no {event!r} line in {timeout_s} s")


def start(*args: object, endpoint: str) -> subprocess.Popen:
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}
    return subprocess.Popen(
        [SCRIPT, *map(str, args), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def stop(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGTERM)
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return err


def test_run_and_follow_outlive_an_outage_of_the_store(tmp_path, source, s3_url, seaweed):
    path, model = source
    port = int(seaweed.endpoint.rsplit(":", 1)[1])
    proxy = FaultyProxy(("127.0.0.1", port), fault_rate=0.0)
    proxy.down = True  # the store is unreachable when both start
    archiver = start("archive", "run", path, s3_url, "--interval", "0.2s", endpoint=proxy.endpoint)
    follower = start(
        "archive", "follow", s3_url, tmp_path / "replica", "--interval", "0.2s",
        endpoint=proxy.endpoint,
    )  # fmt: skip
    try:
        archived, followed = lines_of(archiver), lines_of(follower)
        failure = wait_for(archived, "failure", 120)  # was: exit 1 at the first error
        assert s3_url in failure["error"] and "cannot reach the server" in failure["error"]
        assert failure["retry_in_s"] > 0
        assert wait_for(followed, "failure", 120)["retry_in_s"] > 0
        assert archiver.poll() is None and follower.poll() is None
        proxy.down = False
        committed = wait_for(archived, "commit", 120)
        deadline = time.monotonic() + 120
        while True:
            status = wait_for(followed, "applied", max(deadline - time.monotonic(), 0.1))
            if status["end_offset"] == committed["end_offset"]:
                break
        assert state_of(tmp_path / "replica") == model.state()
    finally:
        for process in (archiver, follower):
            if process.poll() is None:
                stop(process)
        proxy.close()


def test_a_follower_whose_manifest_was_pruned_takes_the_newest(tmp_path, source):
    path, model = source
    url = f"file://{tmp_path}/archive"
    run("archive", "push", path, url)
    run("archive", "follow", url, tmp_path / "replica", "--once")
    rng = random.Random(62)
    log = new_log(path)
    model.append(log, rng, 100)
    log.compact(force=True)  # a rewritten segment, and new ones
    log.close()
    run("archive", "push", path, url)
    run("archive", "prune", url, "--retention", "0s")  # manifest 0, the replica's, is gone
    done = run("archive", "follow", url, tmp_path / "replica", "--once", "--json")
    status = json.loads(done.stdout.splitlines()[-1])
    assert status["sequence"] == 1 and status["lag_ms"] == 0
    assert state_of(tmp_path / "replica") == model.state()


def test_lag_of_a_current_replica_is_zero(tmp_path, source):
    path, _model = source
    url = f"file://{tmp_path}/archive"
    run("archive", "push", path, url)
    time.sleep(0.3)  # the manifest is older than the check: the old lag read its age
    status = json.loads(run("archive", "follow", url, tmp_path / "r", "--once", "--json").stdout)
    assert status["lag_ms"] == 0


def test_verify_of_an_empty_or_mistyped_prefix_fails(tmp_path, source):
    path, _model = source
    url = f"file://{tmp_path}/archive"
    run("archive", "push", path, url)
    mistyped = run("archive", "verify", f"file://{tmp_path}/archiv", check=1)
    assert "no manifest" in mistyped.stdout and "ok:" not in mistyped.stdout
    assert json.loads(run("archive", "verify", url, "--json").stdout)["ok"] is True


def test_interval_below_the_floor_is_refused(tmp_path, source):
    path, _model = source
    url = f"file://{tmp_path}/archive"
    for args in (("run", path, url), ("follow", url, tmp_path / "r")):
        refused = run("archive", *args, "--interval", "0s", check=2)
        assert "--interval must be at least 0.1s" in one_error_line(refused)


def test_as_of_time_takes_epoch_milliseconds(tmp_path, source):
    path, model = source
    url = f"file://{tmp_path}/archive"
    run("archive", "push", path, url)
    committed = json.loads(run("archive", "list", url, "--json").stdout)["manifests"][0]
    done = run("archive", "restore", url, tmp_path / "r", "--as-of-time", committed["time_ms"])
    assert "manifest" in done.stdout
    assert state_of(tmp_path / "r") == model.state()
    early = run("archive", "restore", url, tmp_path / "e", "--as-of-time", "1000", check=1)
    assert "no retained manifest at or before time 1000 ms" in early.stderr


def test_swapped_arguments_name_the_order(tmp_path, source):
    path, _model = source
    url = f"file://{tmp_path}/archive"
    for args, usage in (
        (("run", url, path), "archive run PATH URL"),
        (("push", url, path), "archive push PATH URL"),
        (("restore", tmp_path / "r", url), "archive restore URL DIRECTORY"),
        (("follow", tmp_path / "r", url), "archive follow URL DIRECTORY"),
    ):
        line = one_error_line(run("archive", *args, check=2))
        assert "wrong order" in line and usage in line, line


def test_list_shows_the_log_of_each_generation(tmp_path, source):
    path, _model = source
    url = f"file://{tmp_path}/archive"
    run("archive", "push", path, url)
    other = tmp_path / "other"
    new_log(other).close()
    run("archive", "push", other, url)  # another log: a new generation
    rows = json.loads(run("archive", "list", url, "--json").stdout)["manifests"]
    assert [(r["generation"], r["log_path"]) for r in rows] == [(0, str(path)), (1, str(other))]
    assert rows[0]["log_id"] != rows[1]["log_id"]
    table = run("archive", "list", url).stdout
    assert str(path) in table and str(other) in table and rows[1]["log_id"][:8] in table
