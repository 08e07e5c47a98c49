"""Prometheus metrics and the health endpoints, on one small HTTP server.

``/metrics`` (Prometheus text format, ``prometheus-client``), ``/healthz`` (200 while the
process serves requests), ``/readyz`` (200 once the config is loaded and every root is
readable, 503 with the reason otherwise). The server binds ``127.0.0.1`` unless configured;
port 0 takes any free port (the state file and the start-up log line name it).

Per-log series carry ``log`` (its name) and ``path`` labels; a log that disappears has its
series removed on the next rescan.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from .discovery import LogFacts, LogRef

PREFIX = "compactlog_cleaner"
LOG_LABELS = ("log", "path")


class Metrics:
    """Every series the service exports, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        g = lambda name, doc, labels=LOG_LABELS: Gauge(  # noqa: E731
            f"{PREFIX}_{name}", doc, labels, registry=r
        )
        c = lambda name, doc, labels=LOG_LABELS: Counter(  # noqa: E731
            f"{PREFIX}_{name}", doc, labels, registry=r
        )
        # per log
        self.dirty_ratio = g(
            "log_dirty_ratio", "Cleanable dirty bytes / cleanable bytes (docs/compaction.md)."
        )
        self.log_bytes = g("log_bytes", "Bytes of all segment files.")
        self.dirty_bytes = g("log_dirty_bytes", "Bytes of closed segments past the cleaner point.")
        self.segments = g("log_segments", "Segment files.")
        self.subscriber_lag = g(
            "log_subscriber_lag_records",
            "End offset minus a durable subscriber's committed offset.",
            (*LOG_LABELS, "subscriber"),
        )
        self.last_clean = g("log_last_clean_timestamp_seconds", "When a pass last cleaned it.")
        self.last_duration = g("log_last_clean_duration_seconds", "How long that pass took.")
        self.uncleanable = g("log_uncleanable", "1 while marked uncleanable or failing.")
        self.bytes_read = c("log_read_bytes", "Bytes read by cleaning passes.")
        self.bytes_written = c("log_written_bytes", "Bytes written by cleaning passes.")
        self.records_removed = c("log_records_removed", "Records removed by compaction.")
        self.tombstones_removed = c("log_tombstones_removed", "Tombstones removed.")
        self.passes = c("log_passes", "Passes by outcome.", (*LOG_LABELS, "status"))
        # service
        self.rounds = Counter(f"{PREFIX}_rounds", "Cleaning rounds run.", registry=r)
        self.running = Gauge(f"{PREFIX}_passes_running", "Passes running now.", registry=r)
        self.queue = Gauge(f"{PREFIX}_queue_length", "Due logs waiting in this round.", registry=r)
        self.logs = Gauge(f"{PREFIX}_logs", "Logs the service looks after.", registry=r)
        self.errors = Counter(f"{PREFIX}_errors", "Failed passes and probes.", ["kind"], registry=r)
        self.throttled = Counter(
            f"{PREFIX}_throttled_seconds", "Seconds passes slept for the I/O budget.", registry=r
        )
        # archiving (cleaner/archiving.py): read from each job's live statistics
        self.archive = {
            "lag_records": g(
                "archive_lag_records", "Offsets handed out locally that the archive lacks."
            ),
            "lag_seconds": g(
                "archive_lag_seconds", "Seconds since the archive last held all durable data."
            ),
            "bytes": g("archive_shipped_bytes", "Bytes uploaded to the archive (this process)."),
            "objects": g("archive_shipped_objects", "Objects uploaded to the archive."),
            "failures": g("archive_failures", "Failed archiving rounds and restarts."),
            "last_commit": g(
                "archive_last_commit_timestamp_seconds", "When a manifest was last committed."
            ),
        }
        self.started = time.time()
        uptime = Gauge(f"{PREFIX}_uptime_seconds", "Seconds since the service started.", registry=r)
        uptime.set_function(lambda: time.time() - self.started)
        self._known: dict[str, LogRef] = {}
        self._subscribers: dict[str, set[str]] = {}

    def watch_archive(self, ref: LogRef, stats: Any) -> None:
        """Export one archiving job's statistics (read when scraped)."""
        labels = (ref.name, ref.path)
        a = self.archive
        a["lag_records"].labels(*labels).set_function(lambda: stats.lag_records)
        a["lag_seconds"].labels(*labels).set_function(stats.lag_seconds)
        a["bytes"].labels(*labels).set_function(lambda: stats.bytes)
        a["objects"].labels(*labels).set_function(lambda: stats.objects)
        a["failures"].labels(*labels).set_function(lambda: stats.failures)
        a["last_commit"].labels(*labels).set_function(lambda: (stats.last_commit_ms or 0) / 1000)

    def forget_archive(self, ref: LogRef) -> None:
        for metric in self.archive.values():
            self._remove(metric, (ref.name, ref.path))

    def observe_facts(self, facts: LogFacts, *, failing: bool = False) -> None:
        labels = (facts.ref.name, facts.ref.path)
        self._known[facts.ref.path] = facts.ref
        self.dirty_ratio.labels(*labels).set(facts.dirty_ratio)
        self.log_bytes.labels(*labels).set(facts.total_bytes)
        self.dirty_bytes.labels(*labels).set(facts.dirty_bytes)
        self.segments.labels(*labels).set(facts.segments)
        self.uncleanable.labels(*labels).set(
            1 if facts.uncleanable or facts.error or failing else 0
        )
        previous = self._subscribers.get(facts.ref.path, set())
        for gone in previous - set(facts.subscriber_lag):
            self._remove(self.subscriber_lag, (*labels, gone))
        for name, lag in facts.subscriber_lag.items():
            self.subscriber_lag.labels(*labels, name).set(lag)
        self._subscribers[facts.ref.path] = set(facts.subscriber_lag)

    def observe_pass(self, outcome: Any) -> None:
        labels = (outcome.ref.name, outcome.ref.path)
        self.passes.labels(*labels, outcome.status).inc()
        stats = outcome.stats
        if stats is not None:
            self.bytes_read.labels(*labels).inc(stats.bytes_read + stats.map_bytes_read)
            self.bytes_written.labels(*labels).inc(stats.bytes_written)
            self.records_removed.labels(*labels).inc(stats.records_removed)
            self.tombstones_removed.labels(*labels).inc(stats.tombstones_removed)
            self.throttled.inc(stats.throttled_seconds)
        if outcome.status == "cleaned":
            self.last_clean.labels(*labels).set(time.time())
            self.last_duration.labels(*labels).set(outcome.seconds)
        if outcome.status in ("failed", "uncleanable"):
            self.uncleanable.labels(*labels).set(1)
            self.errors.labels(outcome.status).inc()

    def forget_missing(self, present: set[str]) -> None:
        """Drop the series of logs that are gone."""
        for path in [p for p in self._known if p not in present]:
            ref = self._known.pop(path)
            labels = (ref.name, ref.path)
            for metric in (
                self.dirty_ratio,
                self.log_bytes,
                self.dirty_bytes,
                self.segments,
                self.last_clean,
                self.last_duration,
                self.uncleanable,
                self.bytes_read,
                self.bytes_written,
                self.records_removed,
                self.tombstones_removed,
            ):
                self._remove(metric, labels)
            for name in self._subscribers.pop(path, set()):
                self._remove(self.subscriber_lag, (*labels, name))
            for status in ("cleaned", "skipped", "busy", "aborted", "uncleanable", "failed"):
                self._remove(self.passes, (*labels, status))

    @staticmethod
    def _remove(metric: Any, labels: tuple[str, ...]) -> None:
        try:
            metric.remove(*labels)
        except KeyError:
            pass

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HealthServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on a background thread."""

    def __init__(
        self, metrics: Metrics, address: str, port: int, ready: Callable[[], str | None]
    ) -> None:
        handler = _handler(metrics, ready)
        self.server = ThreadingHTTPServer((address, port), handler)
        self.server.daemon_threads = True
        self.address, self.port = self.server.server_address[:2]
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="cleaner-http", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(metrics: Metrics, ready: Callable[[], str | None]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "compactlog-cleaner"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, metrics.render(), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b"ok\n")
            elif path == "/readyz":
                problem = ready()
                if problem is None:
                    self._send(200, b"ready\n")
                else:
                    self._send(503, f"not ready: {problem}\n".encode())
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n")

        def _send(self, code: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every few seconds would drown the service's own log

    return Handler
