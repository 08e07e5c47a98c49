"""How ``compactlog compact`` shows a pass's progress (``compactlog.compaction.progress``).

Everything goes to stderr, so stdout keeps its contract (the statistics, or one JSON
document with ``--json``). The modes of ``--progress``:

``bar``
    a rich progress bar per phase: bytes done of planned, rate, ETA (transient: it is gone
    when the pass ends).
``lines``
    plain lines ``compactlog: progress: <phase> <done> of <planned> (<pct>%), <rate>``: the
    first and last event of each phase, and at most one line every :data:`LINE_SECONDS`
    between.
``json``
    every event as one JSON object per line (``{"phase", "bytes_done", "bytes_planned"}``),
    for a machine reading stderr.
``none``
    nothing.
``auto`` (the default)
    ``bar`` when stderr is a terminal, else ``lines``; with ``--json``, ``none``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from .output import human_bytes

MODES = ("auto", "bar", "lines", "json", "none")
LINE_SECONDS = 5.0
TITLES = {"map": "building the offset map", "verify": "verifying", "rewrite": "rewriting"}


def resolve_mode(mode: str, as_json: bool) -> str:
    """``auto`` made concrete (see the module docstring)."""
    if mode != "auto":
        return mode
    if as_json:
        return "none"
    return "bar" if sys.stderr.isatty() else "lines"


class ProgressDisplay:
    """A context manager whose :meth:`__call__` takes ``CompactionProgress`` events."""

    def __init__(self, mode: str, *, clock: Callable[[], float] | None = None) -> None:
        self.mode = mode
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
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(binary_units=True),
                # (rich's TransferSpeedColumn says MB/s, decimal: one unit, MiB, everywhere)
                TextColumn("{task.fields[rate]}"),
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
        self.bar.update(task, completed=event.bytes_done, total=max(event.bytes_planned, 1))
        speed = next(t.speed for t in self.bar.tasks if t.id == task)
        self.bar.update(task, rate=f"{human_bytes(speed)}/s" if speed else "?")

    def _line(self, event: Any) -> None:
        now = time.monotonic()
        first = event.bytes_done == 0
        last = event.bytes_done == event.bytes_planned
        if first:
            self.phase_started = now
        elif not last and now - self.last_line < LINE_SECONDS:
            return
        self.last_line = now
        percent = 100 * event.fraction
        text = (
            f"compactlog: progress: {event.phase} {human_bytes(event.bytes_done)} of "
            f"{human_bytes(event.bytes_planned)} ({percent:.0f}%)"
        )
        elapsed = now - self.phase_started
        if not first and elapsed > 0:
            text += f", {human_bytes(event.bytes_done / elapsed)}/s"
            if not last:
                left = (event.bytes_planned - event.bytes_done) / (event.bytes_done / elapsed)
                text += f", ETA {left:.0f}s" if event.bytes_done else ""
        click.echo(text, err=True)
