"""``compactlog archive``: a continuous, compacted archive of a log in object storage.

URLs: ``s3://bucket/prefix`` (credentials, region and endpoint from the ``AWS_*``
environment variables, ``AWS_ENDPOINT_URL`` and ``AWS_ALLOW_HTTP=true`` included),
``gs://``, ``az://``, ``file:///path``. Durations take a unit: ``0.2s``, ``90m``, ``7d``,
``0s``. Exit codes: 0 success, 1 a problem found (verify) or a failure, 2 bad usage.
See docs/archive.md.
"""

from __future__ import annotations

import re
import signal
import threading
from typing import Any

import click

from compactlog.archive.retry import MIN_INTERVAL_S

from .common import _TIME_UNITS, json_option, log_dir
from .output import (
    EXIT_OK,
    EXIT_PROBLEM,
    UsageProblem,
    emit_json,
    emit_json_line,
    human_bytes,
    iso_ms,
    parse_timestamp,
    print_fields,
    print_table,
)

STORE_HELP = """
\b
S3 settings (environment; docs/archive.md "Settings"):
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY  credentials (AWS_SESSION_TOKEN if temporary)
  AWS_REGION                                the bucket's region
  AWS_ENDPOINT_URL                          another S3 server: http(s)://host:port
  AWS_ALLOW_HTTP=true                       needed for an http:// endpoint
  AWS_SKIP_SIGNATURE=true                   a public bucket, no credentials
The instance metadata service is asked for credentials only in EC2 (or with
AWS_METADATA_ENDPOINT set).
"""
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def parse_duration_ms(text: str, *, what: str) -> int:
    """``0.2s``, ``90m``, ``7d``, ``0s`` to milliseconds; a unit is required (``0`` too)."""
    raw = text.strip().lower()
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number) :]
    if not unit or unit not in _TIME_UNITS:
        raise UsageProblem(
            f"{what} needs a unit (ms, s, m, h, d, w), as in 0.2s, 90m or 7d; not {text!r}"
        )
    try:
        value = float(number)
    except ValueError:
        raise UsageProblem(f"{what} must be a number with a unit, not {text!r}") from None
    if value < 0:
        raise UsageProblem(f"{what} must not be negative, not {text!r}")
    return round(value * _TIME_UNITS[unit])


def parse_time_ms(text: str) -> int:
    """An ISO 8601 time (``2026-11-26T23:00:00Z``; no zone means UTC) or milliseconds since
    the epoch (as Spark's ``asOfTimestamp`` takes) to ms since the epoch."""
    try:
        return parse_timestamp(text)
    except UsageProblem as problem:
        raise UsageProblem(f"--as-of-time: {problem.message}") from None


def parse_interval_s(text: str) -> float:
    """``--interval`` in seconds, refused below ``MIN_INTERVAL_S``: every round or check
    costs requests (a LIST at least), and ``0s`` made 651 rounds in 5 s against S3."""
    seconds = parse_duration_ms(text, what="--interval") / 1000
    if seconds < MIN_INTERVAL_S:
        raise UsageProblem(
            f"--interval must be at least {MIN_INTERVAL_S:g}s (each round costs store "
            f"requests), not {text!r}"
        )
    return seconds


def is_url(text: str) -> bool:
    return bool(_URL.match(text))


def ordered(url: str, local: str, usage: str) -> tuple[str, str]:
    """``(url, local)`` as given, or exit 2 naming the order when they came swapped (a URL
    where the local path goes, and no URL where the URL goes)."""
    if is_url(local) and not is_url(url):
        raise UsageProblem(f"arguments in the wrong order: {usage} (got {local!r} second)")
    return url, local


def _store(url: str) -> Any:
    try:
        from compactlog.archive import open_store
    except ImportError as error:  # pragma: no cover - obstore missing
        raise UsageProblem(
            f"the archive needs obstore: pip install 'compactlog[archive]' ({error})"
        ) from None
    return open_store(url)


class _Stop:
    """Set by SIGTERM/SIGINT: the command finishes what is in flight, then returns."""

    def __init__(self) -> None:
        self.event = threading.Event()
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda *_: self.event.set())

    def __call__(self) -> bool:
        return self.event.is_set()


@click.group(epilog=STORE_HELP)
def archive() -> None:
    """Archive a log to object storage continuously; restore it, follow it, check it.

    \b
    Examples:
      compactlog archive run ./log s3://bucket/app --interval 1s --retention 7d
      compactlog archive push ./log file:///mnt/backup/app
      compactlog archive list s3://bucket/app
      compactlog archive restore s3://bucket/app ./restored --as-of-time 2026-11-26T12:00Z
      compactlog archive follow s3://bucket/app ./replica
      compactlog archive verify s3://bucket/app
      compactlog archive prune s3://bucket/app --retention 0s
    """


@archive.command(epilog=STORE_HELP)
@click.argument("path")
@click.argument("url")
@click.option(
    "--interval", default="1s", show_default=True, help="Time between rounds (at least 0.1s)."
)
@click.option(
    "--retention",
    default="7d",
    show_default=True,
    help="Keep manifests (restore points) this long; 0s keeps only the newest.",
)
@json_option
def run(path: str, url: str, interval: str, retention: str, as_json: bool) -> int:
    """Archive the log at PATH to URL until stopped (SIGTERM: the round in flight starts no
    new upload, waits for the running ones, commits what they complete when it is a
    consistent view, then it exits 0). One line per commit, prune and failure; a store
    error is retried with backoff (up to 30 s apart), never the end of the command."""
    from compactlog.archive.run import run as run_loop

    url, path = ordered(url, path, "compactlog archive run PATH URL")
    interval_s = parse_interval_s(interval)
    retention_ms = parse_duration_ms(retention, what="--retention")
    directory = log_dir(path)
    store = _store(url)
    stop = _Stop()

    def report(event: str, document: dict[str, Any]) -> None:
        if as_json:
            emit_json_line({"event": event, **document})
        else:
            fields = " ".join(f"{k}={v}" for k, v in document.items())
            click.echo(f"{event}: {fields}")

    stats = run_loop(
        directory,
        store,
        interval_s=interval_s,
        retention_ms=retention_ms,
        should_stop=stop,
        report=report,
    )
    report("stopped", stats.to_json())
    return EXIT_OK


@archive.command(epilog=STORE_HELP)
@click.argument("path")
@click.argument("url")
@json_option
def push(path: str, url: str, as_json: bool) -> int:
    """One round: ship what is durable and new in the log at PATH, commit a manifest."""
    from compactlog.archive.push import push_once

    url, path = ordered(url, path, "compactlog archive push PATH URL")
    result = push_once(log_dir(path), _store(url))
    if as_json:
        emit_json(result.to_json())
    else:
        print_fields(
            [
                ("committed", result.manifest.sequence if result.manifest else "nothing new"),
                ("objects", result.objects),
                ("bytes", human_bytes(result.bytes)),
                ("end offset", result.end_offset),
                ("new generation", result.new_generation),
            ]
        )
    return EXIT_OK


@archive.command(epilog=STORE_HELP)
@click.argument("url")
@click.argument("directory")
@click.option(
    "--as-of-offset", type=int, default=None, help="Newest manifest ending at or before N."
)
@click.option(
    "--as-of-time",
    default=None,
    help="Newest manifest committed at or before (ISO 8601, or ms since the epoch).",
)
@json_option
def restore(
    url: str, directory: str, as_of_offset: int | None, as_of_time: str | None, as_json: bool
) -> int:
    """Rebuild a log in DIRECTORY (new or empty; an interrupted restore resumes)."""
    from compactlog.archive.restore import restore as restore_log

    url, directory = ordered(url, directory, "compactlog archive restore URL DIRECTORY")
    if as_of_offset is not None and as_of_time is not None:
        raise UsageProblem("give --as-of-offset or --as-of-time, not both")
    if as_of_offset is not None and as_of_offset < 0:
        raise UsageProblem("--as-of-offset must not be negative")
    when = parse_time_ms(as_of_time) if as_of_time is not None else None
    result = restore_log(_store(url), directory, as_of_offset=as_of_offset, as_of_time_ms=when)
    if as_json:
        emit_json(result.to_json())
    else:
        print_fields(
            [
                ("restored", result.path),
                ("manifest", f"{result.sequence} (generation {result.generation})"),
                ("end offset", result.end_offset),
                ("segments", f"{result.segments} ({result.reused_segments} already there)"),
                ("fetched", human_bytes(result.bytes)),
                ("seconds", f"{result.seconds:.2f}"),
            ]
        )
    return EXIT_OK


@archive.command(epilog=STORE_HELP)
@click.argument("url")
@click.argument("directory")
@click.option(
    "--interval", default="1s", show_default=True, help="Time between checks (at least 0.1s)."
)
@click.option("--once", is_flag=True, help="Bring the replica up to date once and exit.")
@json_option
def follow(url: str, directory: str, interval: str, once: bool, as_json: bool) -> int:
    """Keep a read-only replica of the archived log in DIRECTORY: one line per change
    (lag 0 when the replica holds the archive's newest manifest) and per failure. A store
    error, or a manifest pruned while no follower ran, is retried with backoff (up to
    30 s apart), never the end of the command; with --once a failure exits 1."""
    from compactlog.archive.follow import follow as follow_loop

    url, directory = ordered(url, directory, "compactlog archive follow URL DIRECTORY")
    interval_s = parse_interval_s(interval)
    stop = _Stop()
    failures: list[str] = []

    def failed(error: Exception, retry_in_s: float, status: Any) -> None:
        failures.append(str(error))
        if as_json:
            emit_json_line(
                {"event": "failure", "error": str(error), "retry_in_s": retry_in_s}
                | {"lag_ms": status.lag_ms}
            )
        else:
            click.echo(
                f"failure: {error} (retry in {retry_in_s:g}s, lag {status.lag_ms / 1000:.1f}s)"
            )

    def report(status: Any) -> None:
        if as_json:
            emit_json_line(status.to_json())
        else:
            click.echo(
                f"manifest {status.sequence}: end offset {status.end_offset}, "
                f"lag {status.lag_ms / 1000:.1f}s"
            )

    follow_loop(
        _store(url),
        directory,
        interval_s=interval_s,
        should_stop=(lambda: True) if once else stop,
        report=report,
        failed=failed,
    )
    return EXIT_PROBLEM if once and failures else EXIT_OK


@archive.command(name="list", epilog=STORE_HELP)
@click.argument("url")
@json_option
def list_(url: str, as_json: bool) -> int:
    """Generations and manifests: sequence, the log each belongs to (its id, and the host
    and path the archiver read it at), offsets, time, size."""
    from compactlog.archive import manifest as manifests
    from compactlog.archive.lease import read_lease

    store = _store(url)
    rows = []
    for sequence in manifests.sequences(store):
        m = manifests.load(store, sequence)
        rows.append(
            {
                "sequence": m.sequence,
                "generation": m.generation,
                "log_id": m.log_id,
                "log_host": m.archiver.get("host"),
                "log_path": m.archiver.get("path"),
                "start_offset": m.start_offset,
                "end_offset": m.end_offset,
                "cleaner_point": m.cleaner_point,
                "time_ms": m.time_ms,
                "time": iso_ms(m.time_ms),
                "segments": len(m.segments),
                "objects": sum(len(s.objects) for s in m.segments),
                "bytes": m.total_bytes,
            }
        )
    lease = read_lease(store)
    if as_json:
        emit_json(
            {
                "url": url,
                "lease": lease.to_json() if lease is not None else None,
                "manifests": rows,
            }
        )
        return EXIT_OK
    if not rows:
        click.echo("no manifest: the archive is empty")
        return EXIT_OK
    print_table(
        ["seq", "gen", "log", "start", "end", "cleaner point", "time", "segments", "size"],
        [
            [
                r["sequence"],
                r["generation"],
                _log_label(r),
                r["start_offset"],
                r["end_offset"],
                r["cleaner_point"],
                r["time"],
                r["segments"],
                human_bytes(r["bytes"]),
            ]
            for r in rows
        ],
    )
    return EXIT_OK


def _log_label(row: dict[str, Any]) -> str:
    """``<log id, 8 characters> host:path`` (manifests written before the path was
    recorded show the id alone)."""
    where = f"{row['log_host']}:{row['log_path']}" if row.get("log_path") else ""
    return f"{str(row['log_id'])[:8]} {where}".strip()


@archive.command(epilog=STORE_HELP)
@click.argument("url")
@json_option
def verify(url: str, as_json: bool) -> int:
    """Fetch every object of every manifest and check it; exit 1 naming each problem (an
    archive with no manifest, an empty or mistyped prefix, is one)."""
    from compactlog.archive.verify import verify as verify_archive

    report = verify_archive(_store(url))
    if as_json:
        emit_json(report.to_json())
    else:
        for problem in report.problems:
            click.echo(f"problem: {problem}")
        click.echo(
            f"{'ok' if report.ok else 'PROBLEMS'}: {report.manifests} manifests, "
            f"{report.objects} objects, {human_bytes(report.bytes)} checked"
        )
    return EXIT_OK if report.ok else EXIT_PROBLEM


@archive.command(epilog=STORE_HELP)
@click.argument("url")
@click.option("--retention", required=True, help="Keep restore points this long (0s: newest only).")
@json_option
def prune(url: str, retention: str, as_json: bool) -> int:
    """Delete manifests older than the retention and the objects no manifest left names
    (never what a running restore or follower reads). Takes the archive's lease."""
    from compactlog.archive.lease import Lease
    from compactlog.archive.prune import prune as prune_archive

    retention_ms = parse_duration_ms(retention, what="--retention")
    store = _store(url)
    lease = Lease(store, log="(compactlog archive prune)")
    lease.acquire()
    try:
        result = prune_archive(store, retention_ms)
    finally:
        lease.release()
    if as_json:
        emit_json(result.to_json())
    else:
        print_fields(
            [
                ("manifests deleted", len(result.manifests_deleted)),
                ("objects deleted", result.objects_deleted),
                ("bytes freed", human_bytes(result.bytes_deleted)),
                ("kept for readers", result.kept_for_readers or "none"),
            ]
        )
    return EXIT_OK


__all__ = ["archive", "parse_duration_ms", "parse_time_ms"]
