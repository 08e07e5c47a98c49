"""Which logs a round cleans, in which order (Kafka's ``LogCleanerManager.grabFilthiestLog``).

A log is *due* when an unforced ``compact_log`` would likely do something: its dirty ratio
reaches ``min_cleanable_dirty_ratio``, its first dirty segment is older than
``max_compaction_lag_ms``, tombstones have passed ``delete_retention_ms``, or retention
(``delete``/``consumed``) has a segment to remove. The order: every log past
``max_compaction_lag_ms`` first, then the highest dirty ratio, then the most dirty bytes
(then the name, so the order is total and stable). Logs marked uncleanable, failing
(backing off) or whose facts could not be read are not due.

Ages come from segment mtimes: a closed segment's mtime is at least the timestamp of its
newest record, so "older than the lag by mtime" never starts a pass too early; logs whose
records carry timestamps from the past are caught by the exact check inside
``compact_log`` on the next forced or ratio-triggered pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from sortedcontainers import SortedKeyList

from .discovery import LogFacts


@dataclass(frozen=True, slots=True)
class Candidate:
    """A due log and why."""

    facts: LogFacts
    past_max_lag: bool
    reasons: tuple[str, ...]

    @property
    def priority(self) -> tuple[int, float, int, str]:
        """Smaller sorts first: past the lag, then dirtiest, then most dirty bytes."""
        f = self.facts
        return (0 if self.past_max_lag else 1, -f.dirty_ratio, -f.dirty_bytes, f.ref.path)


def judge(facts: LogFacts, now_ms: int) -> Candidate | None:
    """The candidate for this log, or ``None`` when no pass is due."""
    config = facts.config
    if facts.error is not None or config is None or facts.first_closed_next_base is None:
        return None
    reasons: list[str] = []
    past_lag = False
    if config.compacted and not facts.uncleanable:
        has_dirty = facts.dirty_bytes > 0
        if has_dirty and facts.dirty_ratio >= config.min_cleanable_dirty_ratio:
            reasons.append(f"dirty ratio {facts.dirty_ratio:.3f}")
        if (
            has_dirty
            and config.max_compaction_lag_ms is not None
            and facts.oldest_dirty_mtime_ms is not None
            and now_ms - facts.oldest_dirty_mtime_ms > config.max_compaction_lag_ms
        ):
            past_lag = True
            reasons.append("past max_compaction_lag_ms")
        if facts.tombstones_due:
            reasons.append("tombstones due to expire")
    if retention_due(facts, now_ms):
        reasons.append("retention")
    if not reasons:
        return None
    return Candidate(facts, past_lag, tuple(reasons))


def retention_due(facts: LogFacts, now_ms: int) -> bool:
    """Whether ``delete``/``consumed`` retention would likely remove the oldest segment."""
    config = facts.config
    if config is None or facts.first_closed_next_base is None:
        return False
    if config.deletes_by_retention:
        if config.retention_bytes is not None and (
            facts.total_bytes - facts.first_closed_size >= config.retention_bytes
        ):
            return True
        return (
            config.retention_ms is not None
            and facts.oldest_closed_mtime_ms is not None
            and now_ms - facts.oldest_closed_mtime_ms > config.retention_ms
        )
    if config.deletes_when_consumed:
        lags = facts.subscriber_lag
        if not lags:
            return False
        slowest = facts.end_offset - max(lags.values())
        return facts.first_closed_next_base <= slowest
    return False


class Queue:
    """Due logs kept in priority order (a ``sortedcontainers`` sorted list)."""

    def __init__(self) -> None:
        self._items: SortedKeyList = SortedKeyList(key=lambda c: c.priority)

    def add(self, candidate: Candidate) -> None:
        self._items.add(candidate)

    def pop(self) -> Candidate:
        """The most urgent candidate."""
        return self._items.pop(0)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._items)


def rank(facts: list[LogFacts], now_ms: int) -> Queue:
    """A queue of every due log of ``facts``."""
    queue = Queue()
    for item in facts:
        candidate = judge(item, now_ms)
        if candidate is not None:
            queue.add(candidate)
    return queue
