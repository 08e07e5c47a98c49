"""How ``compactlog compact`` and ``compactlog restore`` show progress: a compaction pass's
(``compactlog.compaction.progress``, in bytes) and the Arrow restore's
(``compactlog.restore.progress``, in records: offsets covered).

Everything goes to stderr, so stdout keeps its contract (the statistics, or one JSON
document with ``--json``). The modes of ``--progress``:

``bar``
    a rich progress bar per phase: done of planned, rate, ETA (transient: it is gone
    when the step ends).
``lines``
    plain lines ``compactlog: progress: <phase> <done> of <planned> (<pct>%), <rate>``: the
    first and last event of each phase, and at most one line every :data:`LINE_SECONDS`
    between.
``json``
    every event as one JSON object per line (``{"phase", "bytes_done", "bytes_planned"}``,
    or ``records_done`` and ``records_planned`` for a restore), for a machine reading
    stderr.
``none``
    nothing.
``auto`` (the default)
    ``bar`` when stderr is a terminal, else ``lines``; with ``--json``, ``none``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from .output import human_bytes, human_count

MODES = ("auto", "bar", "lines", "json", "none")
LINE_SECONDS = 5.0
TITLES = {
    "map": "building the offset map",
    "verify": "verifying",
    "rewrite": "rewriting",
    "write": "restoring",
}


def _amounts(event: Any) -> tuple[int, int]:
    """``(done, planned)`` of a compaction event (bytes) or a restore's (records)."""
    if hasattr(event, "bytes_done"):
        return event.bytes_done, event.bytes_planned
    return event.records_done, event.records_planned


def _records(count: float) -> str:
    return f"{human_count(round(count))} records"


def progress_option(bar: str) -> Callable[[Any], Any]:
    """The ``--progress`` option of a command whose bar shows ``bar``."""
    return click.option(
        "--progress",
        "progress_mode",
        type=click.Choice(MODES),
        default="auto",
        show_default=True,
        help=f"How to show progress, on stderr: a bar ({bar}), plain lines, one JSON object "
        "per event, or none. auto: a bar on a terminal, lines otherwise, none with --json.",
    )


def resolve_mode(mode: str, as_json: bool) -> str:
    """``auto`` made concrete (see the module docstring)."""
    if mode != "auto":
        return mode
    if as_json:
        return "none"
    return "bar" if sys.stderr.isatty() else "lines"


class ProgressDisplay:
    """A context manager whose :meth:`__call__` takes ``CompactionProgress`` events (``unit``
    ``"bytes"``) or a restore's ``RestoreStep`` events (``"records"``)."""

    def __init__(
        self, mode: str, unit: str = "bytes", *, clock: Callable[[], float] | None = None
    ) -> None:
        self.mode = mode
        self.unit = unit
        self.human = human_bytes if unit == "bytes" else _records
        self.clock = clock  # the bar's clock, for its rate and ETA (None: rich's own)
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}
        self.phase_started = 0.0
        self.last_line = 0.0

    def __enter__(self) -> ProgressDisplay:
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            # (rich's TransferSpeedColumn says MB/s, decimal: one unit, MiB, everywhere)
            amounts = (
                [DownloadColumn(binary_units=True), TextColumn("{task.fields[rate]}")]
                if self.unit == "bytes"
                else [MofNCompleteColumn(), TextColumn("records")]
            )
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                *amounts,
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
                get_time=self.clock,
            )
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, event: Any) -> None:
        if self.mode == "json":
            self._json(event)
        elif self.mode == "bar":
            self._bar(event)
        elif self.mode == "lines":
            self._line(event)

    def _json(self, event: Any) -> None:
        click.echo(json.dumps(event.to_dict(), separators=(",", ":")), err=True)

    def _bar(self, event: Any) -> None:
        task = self.tasks.get(event.phase)
        if task is None:
            task = self.bar.add_task(TITLES.get(event.phase, event.phase), total=None, rate="")
            self.tasks[event.phase] = task
        done, planned = _amounts(event)
        self.bar.update(task, completed=done, total=max(planned, 1))
        if self.unit == "bytes":
            speed = next(t.speed for t in self.bar.tasks if t.id == task)
            self.bar.update(task, rate=f"{human_bytes(speed)}/s" if speed else "?")

    def _line(self, event: Any) -> None:
        now = time.monotonic()
        done, planned = _amounts(event)
        first = done == 0
        last = done == planned
        if first:
            self.phase_started = now
        elif not last and now - self.last_line < LINE_SECONDS:
            return
        self.last_line = now
        percent = 100 * event.fraction
        human = self.human
        text = (
            f"compactlog: progress: {event.phase} {human(done)} of {human(planned)} "
            f"({percent:.0f}%)"
        )
        elapsed = now - self.phase_started
        if not first and elapsed > 0:
            text += f", {human(done / elapsed)}/s"
            if not last:
                left = (planned - done) / (done / elapsed)
                text += f", ETA {left:.0f}s" if done else ""
        click.echo(text, err=True)


@contextmanager
def phase_lines(mode: str, logger_name: str) -> Iterator[None]:
    """While it runs, the INFO lines of ``logger_name`` (a step's phases and their times)
    go to stderr as ``compactlog: <line>``, in the ``bar`` and ``lines`` modes."""
    if mode not in ("bar", "lines"):
        yield
        return

    class Echo(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            click.echo(f"compactlog: {record.getMessage()}", err=True)

    logger = logging.getLogger(logger_name)
    handler = Echo(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
