"""Which directory is which: one log, or a table of ``partition-<N>`` logs; a path a user
gives (:func:`absolute_directory`), and waiting for a log to appear there
(:func:`wait_for_log`).

Apart from :mod:`compactlog.spark.partitioned` (the reader and writer of such tables) so
that the data source's schema and a stream's set-up can tell the two apart without
importing the writer and pyarrow's compute kernels: Spark runs both in Python processes it
starts for each query.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from ..errors import ConfigError, InvalidArgumentError, NotALogError
from . import filenames

PARTITION_PREFIX = "partition-"
PARTITION_COLUMN = "partition"
_NAME = re.compile(r"^partition-(\d+)$")
WAIT_POLL_S = (0.01, 0.25)  # wait=: first and longest pause between looks for ``meta``


def absolute_directory(path: Any, argument: str = "path") -> str:
    """``path`` (a ``str`` or ``os.PathLike`` of ``str``) made absolute; anything else is an
    :class:`InvalidArgumentError` naming ``argument`` and the value given."""
    try:
        name = os.fspath(path)
    except TypeError:
        name = None
    if not isinstance(name, str):
        raise InvalidArgumentError(
            f"{argument} must be a str or an os.PathLike of str, not "
            f"{type(path).__name__} ({path!r})"
            + (f"; decode it first: {argument}={os.fsdecode(name)!r}" if name else "")
        )
    return os.path.abspath(name)


def wait_for_log(directory: str, wait: float | bool, *, create: bool, read_only: bool) -> None:
    """Return once ``directory`` holds a log (its ``meta``), polling at growing intervals;
    :class:`NotALogError` when ``wait`` seconds pass first (``True``: no limit)."""
    if create and not read_only:
        raise ConfigError("wait= is for read_only=True or create=False opens (this one creates)")
    if isinstance(wait, bool):
        limit = None
    elif isinstance(wait, int | float) and wait >= 0:
        limit = float(wait)
    else:
        raise ConfigError(f"wait must be True, False or a number of seconds >= 0, not {wait!r}")
    meta = os.path.join(directory, filenames.META)
    deadline = None if limit is None else time.monotonic() + limit
    pause, longest = WAIT_POLL_S
    while not os.path.exists(meta):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise NotALogError(
                f"no log appeared here within {limit:g} s of waiting (wait={wait!r}): no meta file",
                path=directory,
            )
        time.sleep(pause if left is None else min(pause, left))
        pause = min(pause * 2, longest)


def partition_dir(table: str, index: int) -> str:
    return os.path.join(table, f"{PARTITION_PREFIX}{index}")


def list_partitions(table: str) -> list[tuple[int, str]]:
    """``(partition number, log directory)`` of every log in ``table``, by number."""
    if not os.path.isdir(table):
        return []
    found = []
    for name in os.listdir(table):
        match = _NAME.match(name)
        directory = os.path.join(table, name)
        if match and os.path.exists(os.path.join(directory, filenames.META)):
            found.append((int(match.group(1)), directory))
    return sorted(found)


def is_partitioned(path: str) -> bool:
    """A directory of logs (and not itself a log)."""
    return not os.path.exists(os.path.join(path, filenames.META)) and bool(list_partitions(path))


def check_log_or_partitioned(path: str) -> None:
    """Refuse with a :class:`NotALogError` that says what to open a directory that holds
    logs one level down under other names than ``partition-<N>`` (``orders/0``, as the
    cleaner service finds them): a table reads one log, or ``partition-<N>`` logs as one.
    Anything else is left to the open of ``path`` to refuse."""
    if os.path.exists(os.path.join(path, filenames.META)) or not os.path.isdir(path):
        return
    names = sorted(
        name
        for name in os.listdir(path)
        if not name.startswith(".") and os.path.exists(os.path.join(path, name, filenames.META))
    )
    if names:
        raise NotALogError(
            f"not a log, but a directory of logs ({', '.join(names[:5])}"
            f"{', ...' if len(names) > 5 else ''}) not named {PARTITION_PREFIX}<N>: open one "
            f"of them ({os.path.join(path, names[0])}), or name them {PARTITION_PREFIX}0, "
            f"{PARTITION_PREFIX}1, ... to read them as one table (keys routed by "
            "compactlog.routing)",
            path=path,
        )


__all__ = [
    "PARTITION_COLUMN",
    "PARTITION_PREFIX",
    "absolute_directory",
    "check_log_or_partitioned",
    "is_partitioned",
    "list_partitions",
    "partition_dir",
    "wait_for_log",
]
