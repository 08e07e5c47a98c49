"""The service's archiving jobs: each log with an archive URL (``[archive]`` in the config)
archived continuously by its own thread (``compactlog.archive.run``), beside the cleaning.

A job holds the archive's lease and reads the log's files; it never takes part in the
cleaning passes (it holds the cleaner lock for milliseconds per round: a pass starting
then is "busy" and runs at its next turn). A job that fails to start (another archiver
holds the lease, the store is unreachable) or loses its lease is restarted with backoff.
Metrics per log: archive lag in records and seconds, bytes and objects shipped, failures,
last commit time; ``/readyz`` is unready while a log's archive lags more than
``archive.lag_threshold_seconds``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .config import ServiceConfig
from .discovery import LogRef, discover

logger = logging.getLogger("compactlog.cleaner")

RESCAN_SECONDS = 10.0
MAX_RESTART_SECONDS = 60.0


class ArchiveJob:
    """One log's archiving thread."""

    def __init__(self, ref: LogRef, url: str, config: ServiceConfig, stop: threading.Event):
        from compactlog.archive.run import RunStats

        self.ref = ref
        self.url = url
        self.config = config
        self.stop = stop
        self.retired = threading.Event()
        self.stats = RunStats()
        self.restarts = 0
        self.thread = threading.Thread(target=self._loop, name=f"archive-{ref.name}", daemon=True)

    def _stopping(self) -> bool:
        return self.stop.is_set() or self.retired.is_set()

    def _loop(self) -> None:
        from compactlog.archive import open_store
        from compactlog.archive.run import run

        delay = 1.0
        while not self._stopping():
            try:
                run(
                    self.ref.path,
                    open_store(self.url),
                    interval_s=self.config.archive_interval_seconds,
                    retention_ms=round(self.config.archive_retention_seconds * 1000),
                    should_stop=self._stopping,
                    report=self._report,
                    stats=self.stats,
                )
                delay = 1.0
            except Exception as error:  # lease held or lost, a log gone, a store refused
                self.stats.failures += 1
                self.stats.last_error = str(error)
                self.restarts += 1
                logger.warning(
                    f"archive of {self.ref.name} to {self.url} stopped: {error}; "
                    f"restarting in {delay:g}s",
                    extra={"event": "archive_failed", "log": self.ref.name, "url": self.url},
                )
                if not self.retired.is_set():
                    self.stop.wait(delay)
                delay = min(delay * 2, MAX_RESTART_SECONDS)

    def _report(self, event: str, document: dict[str, Any]) -> None:
        level = logging.WARNING if event == "failure" else logging.DEBUG
        logger.log(
            level,
            f"archive {self.ref.name}: {event} {document}",
            extra={"event": f"archive_{event}", "log": self.ref.name, **document},
        )

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "restarts": self.restarts, **self.stats.to_json()}


class ArchiveJobs:
    """Every log's job, kept in step with discovery (a rescan every ``RESCAN_SECONDS``)."""

    def __init__(self, config: ServiceConfig, stop: threading.Event, metrics: Any = None):
        self.config = config
        self.stop = stop
        self.metrics = metrics
        self.jobs: dict[str, ArchiveJob] = {}
        self._thread = threading.Thread(target=self._rescan, name="archive-jobs", daemon=True)

    def start(self) -> None:
        self.sync()
        self._thread.start()

    def _rescan(self) -> None:
        while not self.stop.wait(RESCAN_SECONDS):
            try:
                self.sync()
            except OSError as error:
                logger.warning(f"archive rescan failed: {error}")

    def sync(self) -> None:
        refs = discover(self.config.roots, self.config.logs)
        wanted = {}
        for ref in refs:
            url = self.config.archive_url_for(ref.name, ref.path)
            if url:
                wanted[ref.path] = (ref, url)
        for path in [p for p in self.jobs if p not in wanted]:
            job = self.jobs.pop(path)
            job.retired.set()
            if self.metrics is not None:
                self.metrics.forget_archive(job.ref)
        for path, (ref, url) in wanted.items():
            if path not in self.jobs:
                job = ArchiveJob(ref, url, self.config, self.stop)
                self.jobs[path] = job
                if self.metrics is not None:
                    self.metrics.watch_archive(ref, job.stats)
                job.thread.start()

    def unready(self) -> str | None:
        """The first log whose archive lags past the threshold, as ``/readyz`` says it."""
        threshold = self.config.archive_lag_threshold_seconds
        for job in self.jobs.values():
            lag = job.stats.lag_seconds()
            if lag > threshold:
                return (
                    f"archive of {job.ref.name} lags {lag:.0f}s behind its log (threshold "
                    f"{threshold:g}s; last error: {job.stats.last_error or 'none'})"
                )
        return None

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for job in self.jobs.values():
            job.thread.join(max(deadline - time.monotonic(), 0))
        return all(not job.thread.is_alive() for job in self.jobs.values())

    def document(self) -> dict[str, Any]:
        return {job.ref.name: job.to_dict() for job in self.jobs.values()}


def push_all_once(config: ServiceConfig) -> list[str]:
    """``--once``: one archiving round per log; returns the problems."""
    from compactlog.archive import open_store
    from compactlog.archive.push import push_once

    problems = []
    for ref in discover(config.roots, config.logs):
        url = config.archive_url_for(ref.name, ref.path)
        if not url:
            continue
        try:
            push_once(ref.path, open_store(url))
        except Exception as error:
            problems.append(f"archive of {ref.name}: {error}")
            logger.error(
                f"archive of {ref.name} to {url} failed: {error}",
                extra={"event": "archive_failed", "log": ref.name, "url": url},
            )
    return problems


__all__ = ["ArchiveJob", "ArchiveJobs", "push_all_once"]
