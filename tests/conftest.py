"""Shared fixtures of the storage-engine suite: a log directory, an injected clock."""

from __future__ import annotations

import pytest

from .helpers import FakeClock


@pytest.fixture
def log_dir(tmp_path):
    """A path where a fresh log may be created."""
    return tmp_path / "log"


@pytest.fixture
def clock():
    """An injectable clock (ms) that only moves when a test moves it."""
    return FakeClock(1_700_000_000_000)
