"""The service's state file: what ``compactlog cleaner status`` shows, without HTTP.

A JSON document rewritten after every round and every pass (pid, heartbeat, metrics
address, counters, and per log: size, dirty ratio, last clean, failures, uncleanable
reason, running pass). It is a report, never an input: the service does not read it back
(a restart starts from the logs themselves), so losing it loses nothing.

Crash protocol of :func:`write_state` (``FileSystem.write_atomic``, the one atomic write):

1. Write ``<state>.<pid>.<n>.tmp`` in the same directory and fsync it. Death here leaves a
   stray temporary file and the previous state intact; the next start removes strays
   (:func:`remove_stray_temps`, under the service lock).
2. Rename it over ``<state>``: readers see the old or the new document, never a mix.
3. fsync the directory. A failure here is an error like any other (the scheduler logs
   ``state_error``): the rename may not survive a power cut.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from compactlog.storage.fsio import DEFAULT_FS

STATE_VERSION = 1


def write_state(path: str, document: dict[str, Any]) -> None:
    """Replace the state file with ``document`` (steps 1-3 of the module docstring)."""
    data = json.dumps(document, indent=1, sort_keys=True, default=str).encode() + b"\n"
    DEFAULT_FS.write_atomic(os.path.dirname(path) or ".", os.path.basename(path), data)


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
