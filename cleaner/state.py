"""The service's state file: what ``compactlog cleaner status`` shows, without HTTP.

A JSON document rewritten after every round and every pass (pid, heartbeat, metrics
address, counters, and per log: size, dirty ratio, last clean, failures, uncleanable
reason, running pass). It is a report, never an input: the service does not read it back
(a restart starts from the logs themselves), so losing it loses nothing.

Crash protocol of :func:`write_state`:

1. Write ``<state>.<pid>.tmp`` in the same directory and fsync it. Death here leaves a
   stray temporary file and the previous state intact; the next start removes strays
   (:func:`remove_stray_temps`, under the service lock).
2. Rename it over ``<state>``: readers see the old or the new document, never a mix.
3. fsync the directory (best effort: a lost rename after a power cut only shows an older
   report).
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

STATE_VERSION = 1


def write_state(path: str, document: dict[str, Any]) -> None:
    """Replace the state file with ``document`` (steps 1-3 of the module docstring)."""
    data = json.dumps(document, indent=1, sort_keys=True, default=str).encode() + b"\n"
    directory = os.path.dirname(path) or "."
    temp = f"{path}.{os.getpid()}.tmp"
    # 1.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    # 2.
    os.replace(temp, path)
    # 3.
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def read_state(path: str) -> dict[str, Any]:
    """The last state written (``FileNotFoundError`` if the service never ran here)."""
    with open(path, "rb") as handle:
        document = json.loads(handle.read())
    if not isinstance(document, dict) or document.get("version") != STATE_VERSION:
        raise ValueError(f"{path}: not a compactlog-cleaner state file")
    return document


def remove_stray_temps(path: str) -> list[str]:
    """Step 1's leftovers of a service killed mid-write (caller holds the service lock)."""
    removed = []
    for temp in glob.glob(glob.escape(path) + ".*.tmp"):
        try:
            os.remove(temp)
            removed.append(temp)
        except FileNotFoundError:
            pass
    return removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
