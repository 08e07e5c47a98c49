"""Finding the logs to clean, and what each one looks like without reading its data.

A root is a directory whose subdirectories holding a ``meta`` file are logs; roots are
rescanned every round, so a log created while the service runs is picked up and a deleted
one dropped. Explicit log paths are taken as they are.

:func:`probe` learns what ranking needs from small files only: ``meta`` (config, log start,
uncleanable mark), ``cleaner.checkpoint`` (the cleaner point, tombstone marks), subscriber
checkpoints, the head in ``.lock`` (end offset) and segment file names, sizes and mtimes.
It never opens a segment but one: the newest segment of a log that crashed and that no
live writer has reopened, whose end offset is then its data's (``engine/view_end.py``,
read once per version of the file). A round over a hundred idle logs costs a few hundred
``stat`` calls. The dirty ratio is the one every figure uses (``compactlog.compaction.dirty``):
the same as the cleaner's selection. Only a log with ``min_compaction_lag_ms`` set has its
dirty segments' batch headers read, once per segment file (``timestamp_cache``).
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass, field

from compactlog.compaction.dirty import Segment, measure
from compactlog.config import LogConfig
from compactlog.engine.snapshot import MANIFEST as SNAPSHOT_MANIFEST
from compactlog.engine.view_end import view_end_offset
from compactlog.errors import CompactLogError
from compactlog.storage import filenames
from compactlog.storage.head import read_log_head
from compactlog.storage.segment import TimestampCache, bound_by_head, list_segments, segment_path
from compactlog.storage.state_files import list_checkpoints, read_cleaner_state, read_meta


@dataclass(frozen=True, slots=True)
class LogRef:
    """One log the service looks after: ``name`` labels its metrics."""

    name: str
    path: str


@dataclass
class LogFacts:
    """What :func:`probe` found. ``error`` is set (and the rest empty) when it could not."""

    ref: LogRef
    config: LogConfig | None = None
    uncleanable: str | None = None
    segments: int = 0
    total_bytes: int = 0
    clean_bytes: int = 0
    dirty_bytes: int = 0
    dirty_ratio: float = 0.0
    active_bytes: int = 0  # the active segment's data: in no ratio
    first_dirty_offset: int = 0
    end_offset: int = 0
    oldest_dirty_mtime_ms: int | None = None  # mtime of the first dirty closed segment
    oldest_closed_mtime_ms: int | None = None
    first_closed_size: int = 0
    first_closed_next_base: int | None = None
    tombstones_due: bool = False
    subscriber_lag: dict[str, int] = field(default_factory=dict)
    error: str | None = None


def _is_log(path: str) -> bool:
    """A log directory: it has ``meta``. A snapshot has one too, but is a frozen copy that
    its manifest describes byte for byte: cleaning it would break that, so it is skipped."""
    return os.path.exists(os.path.join(path, filenames.META)) and not os.path.exists(
        os.path.join(path, SNAPSHOT_MANIFEST)
    )


def _subdirectories(directory: str) -> list[os.DirEntry[str]]:
    """Visible subdirectories, sorted by name; none where the directory cannot be read."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return []  # readiness reports an unreadable root; the others go on
    found = []
    for entry in entries:
        try:
            if not entry.name.startswith(".") and entry.is_dir():
                found.append(entry)
        except OSError:
            continue
    return found


def discover(roots: tuple[str, ...], logs: tuple[str, ...]) -> list[LogRef]:
    """Every log under ``roots`` plus the explicit ``logs``, each once, sorted by path.

    A root's subdirectory is a log, or a partitioned directory of logs (one log per
    partition, as a Kafka topic has partitions) whose own subdirectories are logs; hidden
    directories (``.snapshots``) and snapshots are skipped. Names are the paths below the
    root (``orders`` or ``orders/0``); a name two logs share is replaced by the paths.
    """
    named: dict[str, str] = {}  # path -> name
    for root in roots:
        for entry in _subdirectories(root):
            if _is_log(entry.path):
                named.setdefault(os.path.abspath(entry.path), entry.name)
                continue
            for inner in _subdirectories(entry.path):
                if _is_log(inner.path):
                    named.setdefault(os.path.abspath(inner.path), f"{entry.name}/{inner.name}")
    for path in logs:
        path = os.path.abspath(path)
        named.setdefault(path, os.path.basename(path) or path)
    unique = sorted(named)
    names = [named[p] for p in unique]
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return [
        LogRef(name if counts[name] == 1 else path, path)
        for name, path in zip(names, unique, strict=True)
    ]


def probe(ref: LogRef, now_ms: int, timestamp_cache: TimestampCache | None = None) -> LogFacts:
    """The log's shape from its small files and segment names and sizes (their data only
    for ``min_compaction_lag_ms``: see the module docstring)."""
    facts = LogFacts(ref)
    directory = ref.path
    try:
        meta = read_meta(directory)
        state = read_cleaner_state(directory)
        bases = list_segments(directory)
        sizes, mtimes = [], []
        for base in bases:
            st = os.stat(segment_path(directory, base))
            sizes.append(st.st_size)
            mtimes.append(st.st_mtime_ns // 1_000_000)
        checkpoints = list_checkpoints(directory)
        head = read_log_head(directory)
        if bases:  # the newest segment's data, without room an exclusive writer reserved
            sizes[-1] = bound_by_head(sizes[-1], bases[-1], head)
    except (CompactLogError, OSError, ValueError, TypeError, KeyError) as error:
        facts.error = (
            f"{type(error).__name__}: {error}" if isinstance(error, KeyError) else str(error)
        )
        return facts
    config = meta.config
    facts.config = config
    facts.uncleanable = meta.uncleanable
    facts.segments = len(bases)
    facts.total_bytes = sum(sizes)
    try:  # (the head while a live writer stands behind it, else the data's end)
        facts.end_offset = view_end_offset(directory, lambda: meta.log_start_offset)
    except (CompactLogError, OSError) as error:
        facts.error = str(error)
        return facts
    facts.subscriber_lag = {
        name: max(0, facts.end_offset - offset) for name, offset in checkpoints.items()
    }
    if len(bases) < 2:
        return facts  # only the active segment: nothing is ever cleanable
    closed = list(zip(itertools.pairwise(bases), sizes, mtimes, strict=False))
    measure_with_lag = functools.partial(
        measure,
        directory,
        [Segment(base, next_base, size) for (base, next_base), size, _ in closed],
        bases[-1],
        cleaner_point=state.first_dirty_offset,
        log_start=meta.log_start_offset,
        now=now_ms,
        active_bytes=sizes[-1],
        timestamp_cache=timestamp_cache,
    )
    try:
        share = measure_with_lag(min_compaction_lag_ms=config.min_compaction_lag_ms)
    except (CompactLogError, OSError):
        # a segment's batch headers cannot be read: rank by the ratio without the lag bound
        # (an upper bound); the pass then finds the damage and marks the log uncleanable
        share = measure_with_lag(min_compaction_lag_ms=0)
    facts.first_dirty_offset = share.first_dirty_offset
    facts.clean_bytes, facts.dirty_bytes = share.clean_bytes, share.dirty_bytes
    facts.dirty_ratio, facts.active_bytes = share.ratio, share.active_bytes
    facts.oldest_dirty_mtime_ms = next(
        (mtime for (_b, next_base), _s, mtime in closed if next_base > share.first_dirty_offset),
        None,
    )
    (_first_base, first_next), first_size, first_mtime = closed[0]
    facts.first_closed_size = first_size
    facts.first_closed_next_base = first_next
    facts.oldest_closed_mtime_ms = first_mtime
    facts.tombstones_due = any(
        m[1] + config.delete_retention_ms <= now_ms for m in state.tombstone_marks
    )
    return facts
