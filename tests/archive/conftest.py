"""Fixtures of the archive's tests: archive URLs (the session's SeaweedFS, ``seaweed``, is in
tests/conftest.py: the docs' pages use it too)."""

from __future__ import annotations

import uuid

import pytest

from .seaweed import BUCKET


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
