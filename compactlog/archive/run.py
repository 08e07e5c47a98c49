"""``compactlog archive run``: archive a log continuously, in the foreground.

Every ``interval`` one round (``push.Archiver.push``), started on the interval's ticks (a
round that takes longer is followed at once by the next); after a commit, retention
(``prune.prune``) at most every ``PRUNE_EVERY_S`` (every commit with ``retention=0``).
A failed round (network, 5xx, timeouts, credentials, a missing bucket) is retried with
exponential backoff up to ``retry.MAX_BACKOFF_S``, reported and counted; nothing half-done
is ever committed, and no store error ends the loop: taking the lease at the start is
retried the same way (only another archiver's live lease, or losing the lease, ends it).
A round that finds the cleaner lock taken (a cleaning pass is running) waits for the next
tick. A stop request (SIGTERM, SIGINT, the cleaner service stopping) cuts the round in
flight short: it starts no new upload, waits only for the running ones, and commits the
complete prefix of its view (``push.Archiver.push`` step 5), so a stop takes about one
upload, not one round (``docker stop`` gives 10 s). A stop that finds no round cut short
(it came between rounds, or after the last upload) runs one last round, whose uploads
start within ``FINAL_ROUND_S``, so that what became durable meanwhile is committed. Then it releases
the lease and returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    ArchiveError,
    CorruptLogError,
    LeaseHeldError,
    LeaseLostError,
    LogLockedError,
)
from .manifest import Manifest
from .prune import prune
from .push import Archiver, PushResult
from .retry import Backoff, sleep_until
from .store import Store, now_ms

PRUNE_EVERY_S = 30.0
FINAL_ROUND_S = 1.0  # the last round after a stop starts uploads for this long at most


@dataclass(slots=True)
class RunStats:
    """What the loop reports (and the cleaner service's metrics read)."""

    rounds: int = 0
    commits: int = 0
    failures: int = 0
    objects: int = 0
    bytes: int = 0
    last_commit_ms: int | None = None
    end_offset: int = 0
    lag_records: int = 0
    last_error: str | None = None
    pruned_objects: int = 0
    caught_up_ms: int | None = None  # when a round last held everything durable then
    extra: dict[str, Any] = field(default_factory=dict)

    def lag_seconds(self, now: int | None = None) -> float:
        """Seconds since the archive last held everything durable in the log (the end of
        the last successful round; since the start when none succeeded yet)."""
        since = self.caught_up_ms if self.caught_up_ms is not None else self.extra.get("started_ms")
        return max(((now or now_ms()) - int(since or now_ms())) / 1000, 0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "commits": self.commits,
            "failures": self.failures,
            "objects": self.objects,
            "bytes": self.bytes,
            "last_commit_ms": self.last_commit_ms,
            "end_offset": self.end_offset,
            "lag_records": self.lag_records,
            "last_error": self.last_error,
            "pruned_objects": self.pruned_objects,
            "lag_seconds": round(self.lag_seconds(), 3),
        }


def run(
    log_path: str,
    store: Store,
    *,
    interval_s: float = 1.0,
    retention_ms: int | None = 7 * 86_400_000,
    should_stop: Callable[[], bool] = lambda: False,
    report: Callable[[str, dict[str, Any]], None] | None = None,
    max_rounds: int | None = None,
    stats: RunStats | None = None,
) -> RunStats:
    """Archive ``log_path`` into ``store`` until ``should_stop()`` (or ``max_rounds``);
    ``stats`` (updated after every round) lets a caller watch it run."""
    import compactlog

    stats = RunStats() if stats is None else stats
    stats.extra.setdefault("started_ms", now_ms())
    log = compactlog.open(log_path, create=False, read_only=True)
    archiver = Archiver(log, store)
    cache: dict[int, Manifest] = {}
    backoff = Backoff(interval_s)

    def failed(error: BaseException, *, back_off: bool = True) -> None:
        stats.failures += 1
        stats.last_error = str(error)
        delay = backoff.failed() if back_off else interval_s
        if report is not None:
            report("failure", {"error": str(error), "retry_in_s": delay})

    try:
        while not _started(archiver, failed):
            sleep_until(time.monotonic() + backoff.delay_s, should_stop)
            if should_stop():
                return stats
        backoff.succeeded()
        last_prune = float("-inf")
        while True:
            stats.rounds += 1
            round_started = time.monotonic()
            result: PushResult | None = None
            try:
                result = archiver.push(should_stop)
            except (LeaseLostError, LeaseHeldError):
                raise
            except LogLockedError:
                result = None  # a cleaning pass holds the lock: next tick
            except (ArchiveError, CorruptLogError, OSError) as error:
                failed(error)  # (damage in the log: reported each round until repaired)
            else:
                backoff.succeeded()
                _account(stats, result)
                if result.manifest is not None and report is not None:
                    report("commit", result.to_json())
                if result.manifest is not None and retention_ms is not None and not result.stopped:
                    due = retention_ms == 0 or time.monotonic() - last_prune >= PRUNE_EVERY_S
                    if due:
                        try:
                            pruned = prune(store, retention_ms, cache=cache)
                            stats.pruned_objects += pruned.objects_deleted
                            last_prune = time.monotonic()
                            if report is not None and (
                                pruned.objects_deleted or pruned.manifests_deleted
                            ):
                                report("prune", pruned.to_json())
                        except ArchiveError as error:
                            failed(error, back_off=False)  # the round committed
            if result is not None and result.stopped:
                break  # cut short by the stop request, and committed what was complete
            if max_rounds is not None and stats.rounds >= max_rounds:
                break
            # rounds start every interval (not an interval after the last one ended), so a
            # record waits at most the interval plus one round: the RPO is I + U
            delay = backoff.delay_s
            sleep_until(
                time.monotonic() + delay if delay else round_started + interval_s, should_stop
            )
            if should_stop():
                # one last round (also when the stop came during a round that was not cut
                # short: its view may predate it), so that what became durable meanwhile is
                # committed, starting uploads for FINAL_ROUND_S at most
                try:
                    result = archiver.push(_after(FINAL_ROUND_S))
                    _account(stats, result)
                    if result.manifest is not None and report is not None:
                        report("commit", result.to_json())
                except (ArchiveError, CorruptLogError, OSError, LogLockedError) as error:
                    failed(error, back_off=False)
                break
    finally:
        archiver.stop()
        log.close()
    return stats


def _started(archiver: Archiver, failed: Callable[[BaseException], None]) -> bool:
    """Take the lease; a store error is reported (``failed``) and ``False`` returned, so
    that the caller retries after its backoff."""
    try:
        archiver.start()
    except (LeaseHeldError, LeaseLostError):
        raise
    except (ArchiveError, OSError) as error:
        failed(error)
        return False
    return True


def _after(seconds: float) -> Callable[[], bool]:
    """A stop request that comes ``seconds`` from now."""
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() > deadline


def _account(stats: RunStats, result: PushResult | None) -> None:
    if result is None:
        return
    stats.objects += result.objects
    stats.bytes += result.bytes
    stats.end_offset = result.end_offset
    stats.lag_records = result.lag_records
    if not result.stopped:
        stats.caught_up_ms = now_ms()
    if result.manifest is not None:
        stats.commits += 1
        stats.last_commit_ms = now_ms()


__all__ = ["RunStats", "run"]
