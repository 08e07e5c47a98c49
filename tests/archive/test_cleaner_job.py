"""The cleaner service archiving its logs (``[archive]`` in its config): every log shipped,
metrics per log, ``/readyz`` unready while an archive lags past the threshold."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request

import pytest
from compactlog.cleaner.config import CleanerConfigError, from_document

from compactlog.archive import manifest as manifests
from compactlog.archive import open_store

from ..test_cleaner_daemon import Daemon, state, wait_for
from .helpers import Model, new_log


def test_archive_settings_are_read_and_checked(tmp_path):
    config = from_document(
        {
            "roots": [str(tmp_path)],
            "archive": {
                "url": "s3://bucket/app",
                "interval_seconds": 0.5,
                "retention_seconds": 0,
                "lag_threshold_seconds": 20,
                "logs": {"orders-*": "file:///backup/orders", "scratch": ""},
            },
        },
        source="test.toml",
    )
    assert config.archive_url_for("users", "/x/users") == "s3://bucket/app/users"
    assert config.archive_url_for("orders-1", "/x/orders-1") == "file:///backup/orders"
    assert config.archive_url_for("scratch", "/x/scratch") is None
    assert config.archive_retention_seconds == 0 and config.archiving
    with pytest.raises(CleanerConfigError) as caught:
        from_document(
            {"archive": {"url": "bucket/app", "interval_seconds": 0, "urll": "s3://b/p"}},
            source="test.toml",
        )
    text = str(caught.value)
    assert "archive.url" in text and "archive URL" in text
    assert "archive.interval_seconds" in text and "positive" in text
    assert "did you mean url" in text


def test_the_service_archives_every_log_and_reports_lag(tmp_path, monkeypatch):
    # "stuck" is archived to an S3 endpoint on a closed loopback port: it never succeeds
    for name, value in {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    root = tmp_path / "root"
    root.mkdir()
    rng = random.Random(61)
    models = {}
    for name in ("alpha", "beta", "stuck"):
        with new_log(root / name) as log:
            models[name] = Model()
            models[name].append(log, rng, 200)
    config = tmp_path / "cleaner.toml"
    config.write_text(
        f"""
roots = ["{root}"]
[schedule]
interval_seconds = 0.5
grace_seconds = 10
[metrics]
port = 0
[archive]
url = "file://{tmp_path}/archive"
interval_seconds = 0.2
retention_seconds = 0
lag_threshold_seconds = 2
[archive.logs]
"stuck" = "s3://no-such-bucket/stuck"
"""
    )
    daemon = Daemon(tmp_path, "--config", str(config), name="archiving")
    try:
        for name in ("alpha", "beta"):
            store = open_store(f"file://{tmp_path}/archive/{name}")
            end = models[name].records[-1][0] + 1
            wait_for(
                lambda s=store, e=end: (m := manifests.latest(s)) is not None and m.end_offset == e,
                f"archive of {name}",
                proc=daemon.proc,
            )
        port = wait_for(lambda: (state(root).get("metrics") or {}).get("port"), proc=daemon.proc)
        base = f"http://127.0.0.1:{port}"
        body = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        shipped = [
            line
            for line in body.splitlines()
            if line.startswith("compactlog_cleaner_archive_shipped_bytes{")
            and 'log="alpha"' in line
        ]
        assert shipped and float(shipped[0].split()[-1]) > 0
        assert "compactlog_cleaner_archive_lag_seconds" in body

        def unready():
            try:
                urllib.request.urlopen(base + "/readyz", timeout=10)
            except urllib.error.HTTPError as error:
                return error.read().decode()
            return None

        why = wait_for(unready, "/readyz unready", proc=daemon.proc)
        assert "archive of stuck lags" in why
        document = state(root)
        assert document["archive"]["alpha"]["commits"] >= 1
        assert document["archive"]["stuck"]["failures"] >= 1
    finally:
        assert daemon.stop() == 0
    assert json.dumps(daemon.events())  # the log lines are JSON
