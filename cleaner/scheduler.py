"""Cleaning rounds and their schedule (APScheduler 3.x).

:class:`Cleaner` runs rounds: rescan the roots, probe every log (small files only), rank the
due ones (``ranking``), run them in priority order on up to ``workers`` threads, record
outcomes (metrics, state file, one structured log line per pass with Kafka's summary) and
back off failing logs exponentially. :func:`build_scheduler` puts rounds on an APScheduler
``BackgroundScheduler``: an interval job for ordinary rounds, and optional cron jobs for
forced passes and for retention. All jobs share one single-thread executor, so rounds
never overlap; ``coalesce=True`` and ``max_instances=1`` fold missed runs into one.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor as JobExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from compactlog.errors import CompactLogError
from compactlog.storage.segment import TimestampCache

from . import overrides
from .config import ServiceConfig
from .discovery import LogFacts, LogRef, discover, probe
from .metrics import Metrics
from .passes import PassOutcome, needs_writer, run_pass
from .ranking import Candidate, Queue, judge
from .state import STATE_VERSION, write_state
from .throttle import SharedThrottle

logger = logging.getLogger("compactlog.cleaner")

PROGRESS_SAVE_SECONDS = 1.0  # how often a running pass refreshes the state file


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class LogStatus:
    """What the service remembers about one log between rounds (in memory only)."""

    ref: LogRef
    facts: LogFacts | None = None
    failures: int = 0
    retry_at: float = 0.0  # wall seconds; a failing log is not tried before
    last_error: str | None = None
    last_outcome: dict[str, Any] | None = None
    last_clean_at: float | None = None
    running: dict[str, Any] | None = None  # the pass in progress
    timestamps: TimestampCache = field(default_factory=dict)  # probe's, per segment file
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        f = self.facts
        return {
            "name": self.ref.name,
            "path": self.ref.path,
            "policy": f.config.cleanup_policy if f is not None and f.config else None,
            "segments": f.segments if f else None,
            "bytes": f.total_bytes if f else None,
            "dirty_bytes": f.dirty_bytes if f else None,
            "dirty_ratio": round(f.dirty_ratio, 4) if f else None,
            "active_segment_bytes": f.active_bytes if f else None,
            "end_offset": f.end_offset if f else None,
            "subscriber_lag": f.subscriber_lag if f else {},
            "uncleanable": (f.uncleanable or f.error) if f else None,
            "failures": self.failures,
            "retry_at": self.retry_at or None,
            "last_error": self.last_error,
            "last_clean_at": self.last_clean_at,
            "last_pass": self.last_outcome,
            "running": dict(self.running) if self.running else None,
        }


class Cleaner:
    """The service's rounds. Thread-safe: rounds run on the scheduler's thread, passes on
    ``workers`` threads, the state file is written from both."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        metrics: Metrics,
        stop: threading.Event,
        state_path: str | None,
        metrics_address: tuple[str, int] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.stop = stop
        self.state_path = state_path
        self.metrics_address = metrics_address
        self.throttle = SharedThrottle(config.io_bytes_per_second, stop=stop)
        self.pool = ThreadPoolExecutor(config.workers, thread_name_prefix="cleaner-pass")
        self.logs: dict[str, LogStatus] = {}
        self.rounds = 0
        self.queued = 0
        self.running = 0
        self.errors = 0
        self.started_at = time.time()
        self.last_round_at: float | None = None
        self.last_round: dict[str, Any] | None = None  # the result `cleaner status` reports
        self.mode = "service"  # or "once" (cron): status judges the last round, not liveness
        self.phase = "starting"
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._save_lock = threading.Lock()  # one writer of the state file at a time
        self.extra_state: dict[str, Any] = {}  # name -> callable: more state-file sections

    # -- one round -----------------------------------------------------------------------
    def round(self, *, force: bool = False, retention_only: bool = False) -> list[PassOutcome]:
        """Rescan, probe, rank, clean. ``force``: every compacted log gets a forced pass;
        ``retention_only``: every log with a deleting policy gets a pass."""
        if self.stop.is_set():
            return []
        kind = "forced" if force else "retention" if retention_only else "interval"
        started = time.monotonic()
        now_ms = wall_ms()
        queue = self._rank(now_ms, force=force, retention_only=retention_only)
        with self._lock:
            self.queued = len(queue)
            self.metrics.queue.set(self.queued)
            self.phase = "running"
        self.save_state()
        futures: list[Future[PassOutcome | None]] = []
        while len(queue):
            candidate = queue.pop()
            futures.append(self.pool.submit(self._pass, candidate, force, now_ms))
        outcomes = [o for o in (f.result() for f in futures) if o is not None]
        problems = sorted(o.ref.name for o in outcomes if o.status in ("failed", "uncleanable"))
        with self._lock:
            self.last_round = {
                "kind": kind,
                "finished_at": time.time(),
                "passes": len(outcomes),
                "cleaned": sum(1 for o in outcomes if o.status == "cleaned"),
                "problems": problems,
                "ok": not problems,
            }
            self.rounds += 1
            self.queued = 0
            self.metrics.queue.set(0)
            self.last_round_at = time.time()
            if self.phase == "running":
                self.phase = "idle"  # not when stopping: shutdown owns the phase then
        self.metrics.rounds.inc()
        self.save_state()
        cleaned = sum(1 for o in outcomes if o.status == "cleaned")
        logger.debug(
            "round done",
            extra={
                "event": "round",
                "kind": kind,
                "passes": len(outcomes),
                "cleaned": cleaned,
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return outcomes

    def _rank(self, now_ms: int, *, force: bool, retention_only: bool) -> Queue:
        refs = discover(self.config.roots, self.config.logs)
        present = {ref.path for ref in refs}
        with self._lock:
            for path in [p for p in self.logs if p not in present]:
                del self.logs[path]
                logger.info("log gone, forgotten", extra={"event": "log_gone", "path": path})
            for ref in refs:
                if ref.path not in self.logs:
                    self.logs[ref.path] = LogStatus(ref)
                    logger.info(
                        f"found log {ref.name}",
                        extra={"event": "log_found", "log": ref.name, "path": ref.path},
                    )
                else:
                    self.logs[ref.path].ref = ref
            self.metrics.logs.set(len(refs))
        self.metrics.forget_missing(present)
        queue = Queue()
        now_s = time.time()
        for ref in refs:
            facts = self._probe(ref, now_ms)
            status = self.logs[ref.path]
            if facts.error is not None or status.retry_at > now_s:
                continue
            candidate = self._candidate(facts, now_ms, force=force, retention_only=retention_only)
            if candidate is not None:
                queue.add(candidate)
        return queue

    def _probe(self, ref: LogRef, now_ms: int) -> LogFacts:
        timestamps = self.logs[ref.path].timestamps
        facts = probe(ref, now_ms, timestamps)
        if facts.error is None and facts.config is not None and self.config.overrides:
            try:  # judged as the pass will run it: stored config, overrides on top
                settings = overrides.settings_for(self.config, ref, facts.config)
                facts = overrides.apply(facts, settings, now_ms)
            except (CompactLogError, OSError) as error:  # a refused rule: report, skip the log
                facts.error = str(error)
        with self._lock:
            status = self.logs[ref.path]
            status.facts = facts
            if facts.error is not None and status.last_error != facts.error:
                self.errors += 1
                self.metrics.errors.labels("probe").inc()
                status.last_error = facts.error
                logger.warning(
                    f"cannot read {ref.name}: {facts.error}",
                    extra={"event": "probe_error", "log": ref.name, "error": facts.error},
                )
            failing = status.failures > 0
        self.metrics.observe_facts(facts, failing=failing)
        return facts

    @staticmethod
    def _candidate(
        facts: LogFacts, now_ms: int, *, force: bool, retention_only: bool
    ) -> Candidate | None:
        config = facts.config
        if config is None:
            return None
        if retention_only:
            return Candidate(facts, False, ("retention window",)) if needs_writer(config) else None
        if force and config.compacted and not facts.uncleanable and facts.segments > 1:
            return Candidate(facts, False, ("forced window",))
        return judge(facts, now_ms)

    # -- one pass (on a worker thread) ----------------------------------------------------
    def _pass(self, candidate: Candidate, force: bool, now_ms: int) -> PassOutcome | None:
        if self.stop.is_set():
            return None
        ref = candidate.facts.ref
        status = self.logs.get(ref.path)
        running: dict[str, Any] = {
            "started_at": time.time(),
            "reasons": list(candidate.reasons),
            "bytes": 0,
            "planned": None,
        }
        with self._lock:
            self.running += 1
            self.queued = max(0, self.queued - 1)
            self.metrics.queue.set(self.queued)
            self.metrics.running.set(self.running)
            if status is not None:
                status.running = running
        self.save_state()
        logger.info(
            f"cleaning {ref.name} ({', '.join(candidate.reasons)})",
            extra={"event": "pass_start", "log": ref.name, "reasons": list(candidate.reasons)},
        )

        last_saved = [time.monotonic()]

        def progress(done: int, planned: int = 0) -> None:
            running["bytes"] = done
            if planned:
                running["planned"] = planned
            if time.monotonic() - last_saved[0] >= PROGRESS_SAVE_SECONDS:
                last_saved[0] = time.monotonic()
                self.save_state()  # so `compactlog cleaner status` shows a long pass moving

        throttler = self.throttle.for_pass(progress)
        try:
            outcome = run_pass(
                ref,
                writer=needs_writer(candidate.facts.config),
                force=force,
                now_ms=now_ms,
                should_abort=self.stop.is_set,
                throttler=throttler,
                progress=progress,
                settings=self.config.overrides_for(ref.name, ref.path),
            )
        except Exception as error:  # a bug, not a log problem: report it, keep serving
            logger.exception(f"unexpected error cleaning {ref.name}")
            outcome = PassOutcome(ref, "failed", f"unexpected {type(error).__name__}: {error}")
        self._record(outcome)
        return outcome

    def _reprobe(self, ref: LogRef) -> None:
        """The log's figures after a pass, so the state file and metrics show its result."""
        status = self.logs.get(ref.path)
        if status is None:
            return
        facts = probe(ref, wall_ms(), status.timestamps)
        if facts.error is None:
            with self._lock:
                status.facts = facts
            self.metrics.observe_facts(facts, failing=status.failures > 0)

    def _record(self, outcome: PassOutcome) -> None:
        ref = outcome.ref
        now = time.time()
        with self._lock:
            self.running -= 1
            self.metrics.running.set(self.running)
            status = self.logs.get(ref.path)
            if status is not None:
                status.running = None
                status.last_outcome = outcome.to_dict()
                if outcome.status == "failed":
                    status.failures += 1
                    delay = min(
                        self.config.backoff_initial_seconds * 2 ** (status.failures - 1),
                        self.config.backoff_max_seconds,
                    )
                    status.retry_at = now + delay
                    status.last_error = outcome.reason
                    self.errors += 1
                elif outcome.status in ("cleaned", "skipped"):
                    status.failures = 0
                    status.retry_at = 0.0
                    status.last_error = None
                if outcome.status == "uncleanable":
                    status.last_error = outcome.reason
                    self.errors += 1
                    if status.facts is not None:  # compact_log just marked it in meta
                        status.facts.uncleanable = outcome.reason
                if outcome.status == "cleaned":
                    status.last_clean_at = now
            self._idle.notify_all()
        self.metrics.observe_pass(outcome)
        if outcome.status in ("cleaned", "skipped"):
            self._reprobe(ref)
        self._log_outcome(outcome, status)
        self.save_state()

    @staticmethod
    def _log_outcome(outcome: PassOutcome, status: LogStatus | None) -> None:
        ref = outcome.ref
        extra: dict[str, Any] = {"event": "pass", **outcome.to_dict()}
        if outcome.status == "cleaned" and outcome.stats is not None:
            logger.info(outcome.stats.summary(ref.name), extra=extra)
        elif outcome.status == "failed":
            retry = status.retry_at - time.time() if status is not None else 0
            logger.error(
                f"cleaning {ref.name} failed: {outcome.reason}; retrying in {retry:.0f}s",
                extra=extra,
            )
        elif outcome.status == "uncleanable":
            logger.error(
                f"{ref.name} is uncleanable: {outcome.reason}; run 'compactlog repair {ref.path}'",
                extra=extra,
            )
        elif outcome.status == "busy":
            logger.info(f"{ref.name} is busy, skipped this round: {outcome.reason}", extra=extra)
        else:
            logger.info(f"{ref.name}: {outcome.status} ({outcome.reason})", extra=extra)

    # -- shutdown and reporting ----------------------------------------------------------
    def wait_idle(self, timeout: float) -> bool:
        """Wait until no pass runs (at most ``timeout`` seconds); returns whether idle."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self.running > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.1))
        return True

    def document(self) -> dict[str, Any]:
        import os

        with self._lock:
            return {
                "version": STATE_VERSION,
                "pid": os.getpid(),
                "phase": self.phase,
                "started_at": self.started_at,
                "updated_at": time.time(),
                "config": self.config.source,
                "roots": list(self.config.roots),
                "explicit_logs": list(self.config.logs),
                "interval_seconds": self.config.interval_seconds,
                "workers": self.config.workers,
                "io_bytes_per_second": self.config.io_bytes_per_second,
                "metrics": (
                    {"address": self.metrics_address[0], "port": self.metrics_address[1]}
                    if self.metrics_address
                    else None
                ),
                "rounds": self.rounds,
                "last_round_at": self.last_round_at,
                "last_round": self.last_round,
                "mode": self.mode,
                "passes_running": self.running,
                "queue": self.queued,
                "errors": self.errors,
                "logs": {path: s.to_dict() for path, s in sorted(self.logs.items())},
                **{name: section() for name, section in self.extra_state.items()},
            }

    def save_state(self) -> None:
        if self.state_path is None:
            return
        try:
            with self._save_lock:
                write_state(self.state_path, self.document())
        except OSError as error:
            logger.warning(
                f"cannot write the state file {self.state_path}: {error}",
                extra={"event": "state_error"},
            )

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def build_scheduler(cleaner: Cleaner, config: ServiceConfig) -> BackgroundScheduler:
    """The interval job (first round at once) and the optional cron windows."""
    scheduler = BackgroundScheduler(
        executors={"default": JobExecutor(1)},
        job_defaults={
            "coalesce": True,
            "max_instances": 1,
            "misfire_grace_time": config.misfire_grace_seconds,
        },
        timezone="UTC",
    )
    scheduler.add_job(
        cleaner.round,
        IntervalTrigger(seconds=config.interval_seconds),
        id="clean",
        name="cleaning round",
        next_run_time=_now(),
    )
    if config.forced_cron:
        scheduler.add_job(
            cleaner.round,
            CronTrigger.from_crontab(config.forced_cron, timezone="UTC"),
            kwargs={"force": True},
            id="forced",
            name="forced passes",
        )
    if config.retention_cron:
        scheduler.add_job(
            cleaner.round,
            CronTrigger.from_crontab(config.retention_cron, timezone="UTC"),
            kwargs={"retention_only": True},
            id="retention",
            name="retention",
        )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    return scheduler


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)
