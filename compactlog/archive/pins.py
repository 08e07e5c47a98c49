"""Reader pins: how a running restore or follower keeps prune away from its manifest.

A reader writes ``readers/<random id>.json`` naming the manifest it reads and an expiry,
refreshes it while it works, and deletes it when done. Prune keeps every manifest (and the
objects it names) that an unexpired pin names (``prune.py``, steps 3 and 5). Litestream
deleted files a running restore needed (litestream#224, #805); this is the fence.

The reader's order matters: it pins *first*, then re-reads the manifest. If the manifest is
still there, prune had not yet deleted it, so prune's second look at the pins (after it
deletes manifests, before it deletes objects) sees the pin and keeps the objects.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from typing import Any

from ..errors import ArchiveError, ObjectMissingError
from .lease import holder_is_dead
from .store import Store, now_ms

PIN_PREFIX = "readers/"
PIN_TTL_MS = 120_000


class Pin:
    """A pin on one manifest, refreshed by a background thread until :meth:`release`."""

    def __init__(self, store: Store, sequence: int, *, ttl_ms: int = PIN_TTL_MS) -> None:
        self.store = store
        self.sequence = sequence
        self.ttl_ms = ttl_ms
        self.key = f"{PIN_PREFIX}{uuid.uuid4().hex}.json"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.write()
        self._thread = threading.Thread(target=self._refresh, name="archive-pin", daemon=True)
        self._thread.start()

    def write(self) -> None:
        body = {
            "sequence": self.sequence,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "expires_ms": now_ms() + self.ttl_ms,
        }
        self.store.put(self.key, json.dumps(body).encode())

    def move(self, sequence: int) -> None:
        """Pin another manifest (a follower moving on); write before reading it."""
        self.sequence = sequence
        self.write()

    def _refresh(self) -> None:
        while not self._stop.wait(self.ttl_ms / 4000):
            try:
                self.write()
            except ArchiveError:
                pass  # the next refresh tries again; the pin lasts ttl_ms

    def detach(self) -> None:
        """Stop refreshing and leave the pin to expire at its time to live (a reader
        that cannot tell when it is done, such as a Spark query's planner)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.store.delete(self.key)
        except ArchiveError:
            pass  # it expires

    def __enter__(self) -> Pin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def live_pins(store: Store) -> dict[str, int]:
    """``{pin key: manifest sequence}`` of every pin not expired (nor left by a dead process
    of this host); expired pins are deleted on the way."""
    from .lease import LeaseInfo

    now = now_ms()
    host = socket.gethostname()
    found: dict[str, int] = {}
    for info in store.list(PIN_PREFIX):
        try:
            data, _etag = store.get(info.key)
            body: dict[str, Any] = json.loads(data)
            sequence, expires = int(body["sequence"]), int(body["expires_ms"])
            holder = LeaseInfo("", str(body["host"]), int(body["pid"]), None, 0, expires, "")
        except ObjectMissingError:
            continue
        except (ValueError, KeyError, TypeError):
            store.delete(info.key)
            continue
        if expires <= now or holder_is_dead(holder, host):
            store.delete(info.key)
            continue
        found[info.key] = sequence
    return found


__all__ = ["PIN_PREFIX", "Pin", "live_pins"]
