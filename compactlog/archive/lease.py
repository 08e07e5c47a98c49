"""One archiver per archive: the lease object ``lease.json``.

Protocol (Litestream's, on conditional writes):

1. Read ``lease.json``. Absent: create it with put-if-absent; whoever's create succeeds
   holds the lease, the other is refused.
2. Present and held by a live archiver (not released, not expired, and not a dead process
   on this host): refuse with :class:`LeaseHeldError` naming its host, pid and since when.
3. Present but released, expired, or held by a process of this host that is gone (an
   archiver killed with ``kill -9`` must not block its successor): take it over with
   put-if-match on the ETag that was read, so that of two successors only one wins.
4. Renew with put-if-match on the ETag of our last write, well before it expires. A failed
   match means another archiver took the lease (ours had expired): stop committing
   (:class:`LeaseLostError`). A manifest is committed only right after a renewal.
5. On a clean exit, release: put-if-match a lease expired at 0, so the next archiver takes
   over at once.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from ..errors import LeaseHeldError, LeaseLostError, ObjectMissingError
from .store import Store, now_ms

LEASE_KEY = "lease.json"
DEFAULT_TTL_MS = 30_000


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """What ``lease.json`` says."""

    owner: str
    host: str
    pid: int
    pid_start: str | None
    since_ms: int
    expires_ms: int
    log: str

    def to_json(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "pid_start": self.pid_start,
            "since_ms": self.since_ms,
            "expires_ms": self.expires_ms,
            "log": self.log,
        }

    @classmethod
    def decode(cls, data: bytes) -> LeaseInfo | None:
        try:
            value = json.loads(data)
            return cls(
                str(value["owner"]),
                str(value["host"]),
                int(value["pid"]),
                value.get("pid_start"),
                int(value["since_ms"]),
                int(value["expires_ms"]),
                str(value.get("log", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None  # a damaged lease binds no one: it is taken over like an expired one

    def describe(self) -> str:
        from datetime import UTC, datetime

        since = datetime.fromtimestamp(self.since_ms / 1000, UTC).isoformat(timespec="seconds")
        return f"host {self.host}, pid {self.pid}, since {since}"


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of ``/proc/<pid>/stat``), to tell a
    recycled pid from the holder; ``None`` where there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode(errors="replace")
        return text[text.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def holder_is_dead(info: LeaseInfo, host: str) -> bool:
    """Whether the holder is a process of this host that no longer runs."""
    if info.host != host:
        return False
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    started = process_start(info.pid)
    return info.pid_start is not None and started is not None and started != info.pid_start


class Lease:
    """This process's hold on an archive (``acquire``, ``renew``, ``release``)."""

    def __init__(self, store: Store, *, log: str = "", ttl_ms: int = DEFAULT_TTL_MS) -> None:
        self.store = store
        self.log = log
        self.ttl_ms = ttl_ms
        self.host = socket.gethostname()
        self.owner = uuid.uuid4().hex
        self.since_ms = 0
        self.expires_ms = 0
        self._etag: str | None = None

    @property
    def held(self) -> bool:
        return self._etag is not None

    def _body(self, expires_ms: int) -> bytes:
        pid = os.getpid()
        info = LeaseInfo(
            self.owner, self.host, pid, process_start(pid), self.since_ms, expires_ms, self.log
        )
        return json.dumps(info.to_json(), sort_keys=True).encode()

    def acquire(self) -> None:
        """Steps 1-3; raises :class:`LeaseHeldError` when a live archiver holds it."""
        for _attempt in range(5):
            now = now_ms()
            self.since_ms = now
            try:
                data, etag = self.store.get(LEASE_KEY)
            except ObjectMissingError:
                created = self.store.put_if_absent(LEASE_KEY, self._body(now + self.ttl_ms))
                if created is not None:
                    self._held(created, now)
                    return
                continue  # another archiver created it first: look at it
            info = LeaseInfo.decode(data)
            if (
                info is not None
                and info.owner != self.owner
                and info.expires_ms > now
                and not holder_is_dead(info, self.host)
            ):
                raise LeaseHeldError(
                    f"another archiver holds this archive ({info.describe()}; "
                    f"log {info.log or '?'}); it expires unless renewed in "
                    f"{(info.expires_ms - now) / 1000:.0f}s",
                    path=self.store.url,
                )
            if etag is None:
                continue
            taken = self.store.put_if_match(LEASE_KEY, self._body(now + self.ttl_ms), etag)
            if taken is not None:
                self._held(taken, now)
                return
        raise LeaseHeldError("the lease keeps changing hands; try again", path=self.store.url)

    def _held(self, etag: str, now: int) -> None:
        self._etag = etag
        self.expires_ms = now + self.ttl_ms

    def renew(self, *, force: bool = False) -> None:
        """Step 4 (when a third of the time to live has passed, or ``force``)."""
        if self._etag is None:
            raise LeaseLostError("this archiver does not hold the lease", path=self.store.url)
        now = now_ms()
        if not force and self.expires_ms - now > self.ttl_ms * 2 // 3:
            return
        etag = self.store.put_if_match(LEASE_KEY, self._body(now + self.ttl_ms), self._etag)
        if etag is None:
            self._etag = None
            raise LeaseLostError(
                "the lease was taken over by another archiver (ours had expired)",
                path=self.store.url,
            )
        self._held(etag, now)

    def ensure(self) -> None:
        """Before a commit: the lease must be ours for a while yet."""
        if self._etag is None:
            raise LeaseLostError("this archiver does not hold the lease", path=self.store.url)
        if self.expires_ms - now_ms() < self.ttl_ms // 2:
            self.renew(force=True)

    def release(self) -> None:
        """Step 5 (best effort: an archiver that cannot release leaves a lease that
        expires)."""
        if self._etag is None:
            return
        try:
            self.store.put_if_match(LEASE_KEY, self._body(0), self._etag)
        except Exception:
            pass
        self._etag = None


def read_lease(store: Store) -> LeaseInfo | None:
    try:
        data, _etag = store.get(LEASE_KEY)
    except ObjectMissingError:
        return None
    return LeaseInfo.decode(data)


__all__ = ["LEASE_KEY", "Lease", "LeaseInfo", "holder_is_dead", "read_lease"]
