"""Shared fixtures of the storage-engine suite: a log directory, an injected clock."""

from __future__ import annotations

import os

import pytest

from compactlog.engine.invariants import check
from compactlog.storage import filenames

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
