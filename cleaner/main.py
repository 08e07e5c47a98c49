"""``compactlog-cleaner``: the entry point of the cleaner service.

    compactlog-cleaner --root DIR [--root DIR ...] --interval SECONDS --metrics-port PORT
    compactlog-cleaner --config cleaner.toml
    compactlog-cleaner --config cleaner.toml --check      # validate and exit
    compactlog-cleaner --root DIR --once                  # one round, then exit (cron)

Settings come from the TOML file, then ``COMPACTLOG_CLEANER_*`` environment variables, then
flags (each overrides the one before). Exit codes: 0 on a clean stop (SIGTERM/SIGINT) or a
successful ``--once``/``--check``; 1 when another service holds a root, the metrics port
cannot be bound, or (``--once``) a log failed or is uncleanable; 2 on a bad configuration
or usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from compactlog import __version__

from .config import (
    CleanerConfigError,
    ServiceConfig,
    check_usable,
    from_environment,
    layer,
    parse_size,
    raise_all,
)
from .config import load_file as load_config_file

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2

logger = logging.getLogger("compactlog.cleaner")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="compactlog-cleaner",
        description="Keep many live compactlog logs compacted: a scheduled cleaning service.",
        epilog="Environment: COMPACTLOG_CLEANER_ROOTS, _INTERVAL, _WORKERS, _METRICS_PORT, "
        "_METRICS_ADDRESS, _IO_BYTES_PER_SECOND, _STATE_FILE, _LOG_FORMAT, ... override the "
        "file; flags override both. See docs/operations.md.",
    )
    parser.add_argument("--version", action="version", version=f"compactlog-cleaner {__version__}")
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    parser.add_argument("--check", action="store_true", help="validate the configuration, exit")
    parser.add_argument(
        "--root", action="append", metavar="DIR", help="a directory of logs (repeatable)"
    )
    parser.add_argument("--log", action="append", metavar="DIR", help="one log (repeatable)")
    parser.add_argument("--interval", type=float, metavar="SECONDS", help="between rounds")
    parser.add_argument("--workers", type=int, help="passes running at once")
    parser.add_argument("--io-rate", metavar="BYTES", help="I/O budget per second, e.g. 50MB")
    parser.add_argument("--metrics-address", metavar="ADDR", help="default 127.0.0.1")
    parser.add_argument("--metrics-port", type=int, metavar="PORT", help="0: any free port")
    parser.add_argument("--no-metrics", action="store_true", help="serve no HTTP at all")
    parser.add_argument("--grace", type=float, metavar="SECONDS", help="shutdown grace period")
    parser.add_argument(
        "--state-file", metavar="FILE", help="default <first root>/" + ".compactlog-cleaner.json"
    )
    parser.add_argument("--forced-cron", metavar="CRONTAB", help="forced passes, e.g. '0 3 * * *'")
    parser.add_argument("--retention-cron", metavar="CRONTAB", help="retention passes")
    parser.add_argument("--log-format", choices=("text", "json"))
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    parser.add_argument(
        "--once",
        action="store_true",
        help="run one round and exit (cron; no metrics unless a metrics setting is given)",
    )
    parser.add_argument(
        "--force", action="store_true", help="with --once: a forced pass on every compacted log"
    )
    return parser.parse_args(argv)


def load_config(args: argparse.Namespace, environ: dict[str, str] | None = None) -> ServiceConfig:
    """Defaults, then the file, then the environment, then the flags. Every problem of the
    three is reported at once; then :func:`check_usable` (roots, something to clean)."""
    problems: list[CleanerConfigError] = []
    config = ServiceConfig()
    if args.config:
        try:
            config = load_config_file(args.config)
        except CleanerConfigError as error:
            problems.append(error)
    try:
        config = from_environment(config, environ)
    except CleanerConfigError as error:
        problems.append(error)
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}

    def flag(name: str, value: Any, option: str) -> None:
        if value is not None:
            values[name] = value
            keys[name] = option

    flag("roots", args.root, "--root")
    flag("logs", args.log, "--log")
    flag("interval_seconds", args.interval, "--interval")
    flag("workers", args.workers, "--workers")
    if args.io_rate is not None:
        try:
            flag("io_bytes_per_second", parse_size(args.io_rate), "--io-rate")
        except ValueError:
            problems.append(
                CleanerConfigError(
                    "--io-rate", f"not a byte count: {args.io_rate!r}", source="command line"
                )
            )
    flag("metrics_address", args.metrics_address, "--metrics-address")
    flag("metrics_port", args.metrics_port, "--metrics-port")
    flag("metrics_enabled", False if args.no_metrics else None, "--no-metrics")
    flag("grace_seconds", args.grace, "--grace")
    flag("state_file", args.state_file, "--state-file")
    flag("forced_cron", args.forced_cron, "--forced-cron")
    flag("retention_cron", args.retention_cron, "--retention-cron")
    flag("log_format", args.log_format, "--log-format")
    flag("log_level", args.log_level, "--log-level")
    config = layer(values, source="command line", keys=keys, base=config, problems=problems)
    raise_all(problems)
    check_usable(config)  # only of a config that parsed: a broken file's roots are unknown
    return config


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, message, and the record's structured fields."""

    _STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in self._STANDARD and not key.startswith("_"):
                document[key] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str, sort_keys=False)


def setup_logging(config: ServiceConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.log_level.upper())


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(argv))


def run(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exit_:  # argparse: --help (0) or bad usage (2)
        return int(exit_.code or 0)
    from .preflight import check as check_directories

    try:
        config = load_config(args)
        warnings = check_directories(config, once=args.once)
    except CleanerConfigError as error:
        print(f"compactlog-cleaner: configuration error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.check:
        for warning in warnings:
            print(f"compactlog-cleaner: warning: {warning}", file=sys.stderr)
        print(f"compactlog-cleaner: configuration OK ({config.source})")
        return EXIT_OK
    setup_logging(config)
    for warning in warnings:
        logger.warning(warning, extra={"event": "root_without_logs"})
    return serve(config, once=args.once, force=args.force)


def serve(config: ServiceConfig, *, once: bool, force: bool = False) -> int:
    """Lock, serve metrics, run rounds until stopped (or once), exit cleanly."""
    from .metrics import HealthServer, Metrics
    from .process import AlreadyRunningError, acquire_all, install_signal_handlers, lock_paths
    from .scheduler import Cleaner
    from .state import remove_stray_temps

    state_path = config.state_path
    try:
        locks = acquire_all(lock_paths(config.roots, state_path))
    except AlreadyRunningError as error:
        logger.error(str(error), extra={"event": "already_running", "holder": error.holder})
        return EXIT_PROBLEM
    except OSError as error:
        logger.error(f"cannot take the service lock: {error}", extra={"event": "lock_error"})
        return EXIT_PROBLEM
    stop = threading.Event()
    install_signal_handlers(stop)
    for temp in remove_stray_temps(state_path):
        logger.info(f"removed {temp} left by a killed service", extra={"event": "recovered"})
    metrics = Metrics()
    server: HealthServer | None = None
    jobs = None
    if config.archiving and not once:
        from .archiving import ArchiveJobs

        jobs = ArchiveJobs(config, stop, metrics)
    try:
        if config.metrics_enabled and not (once and not config.metrics_requested):
            try:
                server = HealthServer(
                    metrics,
                    config.metrics_address,
                    config.metrics_port,
                    lambda: ready(config) or (jobs.unready() if jobs is not None else None),
                )
            except OSError as error:
                logger.error(
                    f"cannot serve metrics on {config.metrics_address}:{config.metrics_port}: "
                    f"{error.strerror or error}",
                    extra={"event": "metrics_error"},
                )
                return EXIT_PROBLEM
            server.start()
        address = (server.address, server.port) if server is not None else None
        cleaner = Cleaner(
            config, metrics=metrics, stop=stop, state_path=state_path, metrics_address=address
        )
        cleaner.mode = "once" if once else "service"
        schedule = "one round" if once else f"every {config.interval_seconds:g}s"
        logger.info(
            f"compactlog-cleaner {__version__} ({os.getpid()}) started: roots "
            f"{list(config.roots)}, logs {list(config.logs)}, {schedule}, "
            f"{config.workers} worker(s), metrics "
            + (f"http://{address[0]}:{address[1]}/metrics" if address else "off"),
            extra={
                "event": "started",
                "pid": os.getpid(),
                "metrics_address": address[0] if address else None,
                "metrics_port": address[1] if address else None,
                "state_file": state_path,
            },
        )
        if once:
            outcomes = cleaner.round(force=force)
            archive_problems = []
            if config.archiving:
                from .archiving import push_all_once

                archive_problems = push_all_once(config)
            cleaner.phase = "stopped"
            cleaner.save_state()
            cleaner.close()
            bad = [o for o in outcomes if o.status in ("failed", "uncleanable")]
            return EXIT_PROBLEM if bad or archive_problems else EXIT_OK
        if jobs is not None:
            jobs.start()
            cleaner.extra_state["archive"] = jobs.document
        code = _run_until_stopped(cleaner, config, stop)
        if jobs is not None:
            jobs.join(config.grace_seconds)  # each job cuts its round short, then commits
        return code
    finally:
        if server is not None:
            server.stop()
        for lock in locks:
            lock.release()


def _run_until_stopped(cleaner: Any, config: ServiceConfig, stop: threading.Event) -> int:
    from .scheduler import build_scheduler

    scheduler = build_scheduler(cleaner, config)
    scheduler.start()
    cleaner.phase = "idle"
    while not stop.wait(0.5):
        pass
    signalled = time.monotonic()
    logger.info(
        f"stopping: no new work; running passes abort (grace {config.grace_seconds:g}s)",
        extra={"event": "stopping", "grace_seconds": config.grace_seconds},
    )
    cleaner.phase = "stopping"
    scheduler.shutdown(wait=False)
    idle = cleaner.wait_idle(config.grace_seconds)
    cleaner.phase = "stopped"
    cleaner.save_state()
    took = time.monotonic() - signalled
    if not idle:
        logger.warning(
            f"grace period over after {took:.1f}s with passes still running; exiting anyway "
            "(safe: the next pass resolves what they left)",
            extra={"event": "stopped", "seconds": took, "clean": False},
        )
        logging.shutdown()
        os._exit(EXIT_OK)  # worker threads cannot be interrupted; the kernel drops our locks
    cleaner.close()
    logger.info(f"stopped in {took:.2f}s", extra={"event": "stopped", "seconds": took})
    return EXIT_OK


def ready(config: ServiceConfig) -> str | None:
    """``/readyz``: ``None`` when every root is a readable directory, else the problem."""
    for root in config.roots:
        if not os.path.isdir(root) or not os.access(root, os.R_OK | os.X_OK):
            return f"root {root} is not a readable directory"
    return None


if __name__ == "__main__":  # pragma: no cover
    main()
