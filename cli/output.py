"""How the CLI talks: JSON for scripts, aligned tables for people, one-line errors.

Exit codes (``docs/cli.md``): 0 success, 1 the command found a problem (corruption, a held
lock, a key not found, a library error), 2 bad usage (unknown option, bad value, a PATH that
is not a log). Errors are one line on stderr: ``compactlog: error: <path>: <problem>``.

Nothing heavy is imported at module level: ``compactlog --help`` must stay fast.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import click

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped

ENCODINGS = ("text", "hex", "base64")


class CliError(click.ClickException):
    """A problem reported as one line on stderr, with an exit code (1 by default)."""

    def __init__(self, message: str, *, path: str | None = None, code: int = EXIT_PROBLEM):
        super().__init__(f"{path}: {message}" if path else message)
        self.exit_code = code

    def show(self, file: Any = None) -> None:  # one line, never a traceback
        error_line(self.format_message())


class UsageProblem(CliError):
    """Bad usage found after parsing (a PATH that is not a log, a malformed value): exit 2."""

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message, path=path, code=EXIT_USAGE)


def error_line(message: str) -> None:
    """Print one error line on stderr (newlines folded so it stays one line)."""
    text = " ".join(str(message).split())
    click.echo(f"compactlog: error: {text}", err=True)


def warning_line(message: str) -> None:
    text = " ".join(str(message).split())
    click.echo(f"compactlog: warning: {text}", err=True)


# -- JSON ----------------------------------------------------------------------------------


def emit_json(document: Any) -> None:
    """One JSON document on stdout (the ``--json`` output of every command but the
    streaming ones, ``dump`` and ``tail``, which print one JSON object per line)."""
    click.echo(json.dumps(document, indent=2, default=_json_default))


def emit_json_line(document: Any) -> None:
    click.echo(json.dumps(document, separators=(",", ":"), default=_json_default))


def _json_default(value: Any) -> Any:
    try:
        import numpy as np

        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return float(value)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def to_plain(value: Any) -> Any:
    """Statistics objects of any shape (dataclass, NamedTuple, dict, plain object) as a
    JSON-ready dict, so the CLI does not depend on how the library spells a result."""
    import dataclasses

    if value is None or isinstance(value, str | int | float | bool):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "_asdict"):
        return {k: to_plain(v) for k, v in value._asdict().items()}
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_plain(v) for v in value]
    if hasattr(value, "__dict__"):
        return {k: to_plain(v) for k, v in vars(value).items() if not k.startswith("_")}
    return _json_default(value)


# -- tables --------------------------------------------------------------------------------


def _render(renderable: Any) -> None:
    """Render with rich, then print through click with trailing blanks stripped (rich pads
    every cell to the column width)."""
    from rich.console import Console

    # a wide virtual terminal when piped, so tables are never wrapped mid-row
    console = Console(
        highlight=False,
        soft_wrap=False,
        width=None if sys.stdout.isatty() else 240,
        color_system="auto" if sys.stdout.isatty() else None,
    )
    with console.capture() as captured:
        console.print(renderable)
    click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()), color=None)


def print_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    title: str | None = None,
    right: Iterable[str] = (),
) -> None:
    """An aligned table (rich); ``right`` names the right-aligned (numeric) columns."""
    from rich import box
    from rich.table import Table

    right_set = set(right)
    if title:
        click.echo(title)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in columns:
        table.add_column(name, justify="right" if name in right_set else "left", no_wrap=True)
    for row in rows:
        table.add_row(*("-" if cell is None else str(cell) for cell in row))
    _render(table)


def print_fields(pairs: Iterable[tuple[str, Any]], *, title: str | None = None) -> None:
    """A two-column name/value table (``meta``, ``stats``...). The title is its own line,
    not the table's (rich would wrap it at the table's width)."""
    from rich.table import Table

    if title:
        click.echo(title)
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for name, value in pairs:
        table.add_row(name, "-" if value is None else str(value))
    _render(table)


# -- values --------------------------------------------------------------------------------


def human_bytes(size: int | float | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover


def human_count(count: int | float | None) -> str:
    return "-" if count is None else f"{count:,}"


def iso_ms(timestamp_ms: int | None) -> str | None:
    """Milliseconds since the epoch as ISO 8601 UTC, e.g. ``2024-05-01T12:00:00.000Z``."""
    if timestamp_ms is None:
        return None
    try:
        moment = _dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=_dt.UTC)
    except (OverflowError, OSError, ValueError):
        return str(timestamp_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{timestamp_ms % 1000:03d}Z"


def printable(data: bytes) -> str:
    """Bytes as readable text: UTF-8 where it is valid and printable, ``\\xNN`` otherwise."""
    text = data.decode("utf-8", errors="backslashreplace")
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)


def encode_bytes(data: bytes | None, encoding: str) -> str | None:
    """Render a key or value for output: ``text`` (printable), ``hex`` or ``base64``."""
    if data is None:
        return None
    if encoding == "hex":
        return data.hex()
    if encoding == "base64":
        return base64.b64encode(data).decode()
    return printable(data)


def decode_input(text: str, encoding: str) -> bytes:
    """A key given on the command line, in ``text`` (UTF-8), ``hex`` or ``base64``."""
    try:
        if encoding == "hex":
            return bytes.fromhex(text)
        if encoding == "base64":
            return base64.b64decode(text, validate=True)
    except ValueError as error:
        raise UsageProblem(f"{text!r} is not valid {encoding}: {error}") from None
    return text.encode("utf-8")


def parse_timestamp(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (UTC unless it says otherwise)."""
    stripped = text.strip()
    if stripped.isdigit():
        return int(stripped)
    try:
        moment = _dt.datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise UsageProblem(
            f"{text!r} is neither milliseconds since the epoch nor an ISO 8601 time"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.UTC)
    return int(moment.timestamp() * 1000)
