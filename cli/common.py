"""What every command shares: the PATH argument, ``--json``/``--force``, opening a log the
right way, and the check for live writers.

Read-only commands open the log with ``read_only=True``: no lock is taken, so they never
block writers. Commands the library makes safe beside live writers (``compact``,
``retention``, ``subscribers add|remove|seek``) open the log without asking who else has
it: the cleaner lock, the swap protocol and atomic checkpoints are what make that safe.

Only changes that are unsafe while a writer runs (``repair``; ``config set`` of a setting
writers read once when they open the log) call :func:`refuse_if_busy`: a non-blocking
``flock`` on ``<log>/.lock`` (held by a writer during each append) plus a look at which
processes keep ``.lock`` open *for writing* (every writer does, for as long as it has the
log open), so an idle writer is found too. A process that only reads (a subscriber, a
read-only open) keeps ``.lock`` open read-only, or not at all, and is not a writer.
``--force`` skips the check.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from compactlog.storage import filenames
from compactlog.storage.lockfile import holders as lock_holders

from .output import CliError, UsageProblem

F = TypeVar("F", bound=Callable[..., Any])


# -- shared options ------------------------------------------------------------------------


def path_argument(func: F) -> F:
    return click.argument("path", type=click.Path(file_okay=False, path_type=str))(func)


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON (stable field names) instead."
    )(func)


def force_option(func: F) -> F:
    return click.option(
        "--force",
        is_flag=True,
        help="Run even while a writer has the log open (the library allows it; you own the "
        "consequences).",
    )(func)


def no_longer_needed_force_option(func: F) -> F:
    """``--force`` on commands that no longer refuse anything: accepted (scripts written
    for older versions keep working) and without effect; listed, so that ``--help`` and
    docs/cli.md say the same."""
    return click.option(
        "--force",
        is_flag=True,
        help="No effect: this command runs beside live writers without it (accepted so that "
        "scripts written for older versions keep working).",
    )(func)


def encoding_option(func: F) -> F:
    return click.option(
        "-e",
        "--encoding",
        type=click.Choice(["text", "hex", "base64"]),
        default="text",
        show_default=True,
        help="How keys and values are printed (text escapes unprintable bytes as \\xNN).",
    )(func)


def raw_option(func: F) -> F:
    return click.option(
        "--raw",
        is_flag=True,
        help="Show keys and values as stored, ignoring the log's declared formats "
        "(--encoding hex or base64 does too).",
    )(func)


# -- paths and opening ---------------------------------------------------------------------


# the log directory this command works on, once ``log_dir`` resolved it: the line of a
# command that Ctrl-C interrupts names it (``main.py``)
WORKING_ON: list[str] = []


def log_dir(path: str) -> str:
    """``path`` as an absolute directory that holds a log, or exit 2 saying why not."""
    directory = os.path.abspath(path)
    WORKING_ON.append(directory)
    if not os.path.exists(directory):
        raise UsageProblem("no such log directory", path=directory)
    if not os.path.isdir(directory):
        raise UsageProblem("not a directory", path=directory)
    if not os.path.exists(os.path.join(directory, filenames.META)):
        raise UsageProblem("not a compactlog log (no meta file)", path=directory)
    return directory


def open_read_only(path: str) -> Any:
    """Open for reading: takes no lock, never blocks writers, never changes a file."""
    import compactlog

    return compactlog.open(log_dir(path), create=False, read_only=True)


def open_beside_writers(path: str) -> Any:
    """Open for writing without asking who else has the log open: for changes the library
    makes safe beside live writers (compaction, retention, config changes through
    ``Log.store_config``). Opening takes the writers' lock only for the moment it reads
    ``meta``."""
    import compactlog

    return compactlog.open(log_dir(path), create=False)


# -- who holds the log ---------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str
    locked: bool  # holds the flock right now (mid-append), not just the file open

    def describe(self) -> str:
        what = "holding the writers' lock" if self.locked else "with the log open for writing"
        return f"pid {self.pid} ({self.command}) {what}" if self.command else f"pid {self.pid}"

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "command": self.command, "locked": self.locked}


def _command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            parts = handle.read().split(b"\0")
    except OSError:
        return ""
    text = " ".join(p.decode(errors="replace") for p in parts if p)
    return text if len(text) <= 80 else text[:77] + "..."


def _opened_for_writing(pid: str, fd: str) -> bool:
    """Whether descriptor ``fd`` of ``pid`` was opened for writing (``/proc/<pid>/fdinfo``
    ``flags``, octal). Readers (subscribers, read-only opens) open ``.lock`` read-only. If
    the flags cannot be read, the process counts as a writer: refusing wrongly is safe."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as handle:
            for line in handle:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY
    except (OSError, ValueError, IndexError):
        pass
    return True


def _openers(lock_path: str, inode: int, device: int) -> set[int]:
    """Pids (other than ours) with ``lock_path`` open for writing: writers keep it open
    while the log is open; readers hold it read-only and are left out. Processes we may not
    inspect are skipped."""
    pids: set[int] = set()
    me = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                stat = os.stat(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if stat.st_ino == inode and stat.st_dev == device and _opened_for_writing(entry, fd):
                pids.add(int(entry))
                break
    return pids


def writer_holders(directory: str) -> list[Holder]:
    """Processes writing to the log: the current ``flock`` holder of ``.lock`` and every
    process that has ``.lock`` open for writing. Empty when no writer has the log open
    (readers and subscribers may)."""
    import fcntl

    lock_path = os.path.join(directory, filenames.WRITER_LOCK)
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        stat = os.fstat(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = False
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            held = True
        lockers = (lock_holders(fd) or set()) if held else set()
    finally:
        os.close(fd)
    openers = _openers(lock_path, stat.st_ino, stat.st_dev)
    holders = [Holder(pid, _command_of(pid), pid in lockers) for pid in sorted(lockers | openers)]
    if held and not holders:
        holders.append(Holder(0, "", True))
    return holders


def busy_description(directory: str) -> str:
    """The writers that have the log open, as an error message names them; empty if none."""
    holders = writer_holders(directory)
    if not holders:
        return ""
    if len(holders) == 1 and holders[0].pid == 0:
        return "another process holds the writers' lock"
    return "; ".join(h.describe() for h in holders)


def refuse_if_busy(directory: str, *, force: bool, why: str) -> None:
    """Exit 1 when a writer has the log (unless ``force``), naming who and ``why`` that is
    unsafe."""
    who = "" if force else busy_description(directory)
    if not who:
        return
    raise CliError(
        f"refusing while a writer has the log open ({who}): {why}; stop the writer first or "
        "pass --force",
        path=directory,
    )


# -- config values -------------------------------------------------------------------------

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 1000,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 1000**2,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 1000**3,
}
_TIME_UNITS = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_TIME_UNITS["w"] = 7 * _TIME_UNITS["d"]


def _field_types() -> dict[str, str]:
    import dataclasses

    from compactlog.config import LogConfig

    return {f.name: str(f.type) for f in dataclasses.fields(LogConfig)}


def parse_config_value(name: str, text: str) -> Any:
    """A config value typed as ``LogConfig`` declares it: ints accept size suffixes
    (``64MiB``) on ``*_bytes*`` names and time suffixes (``7d``, ``30s``) on ``*_ms`` names;
    ``none`` clears an optional limit."""
    types = _field_types()
    if name not in types:
        from compactlog.errors import did_you_mean

        raise UsageProblem(
            f"unknown config name {name!r}; known: {', '.join(sorted(types))}"
            + did_you_mean(name, types)
        )
    kind = types[name]
    raw = text.strip()
    if "None" in kind and raw.lower() in ("none", "null", "off", "unlimited"):
        return None
    if kind.startswith("str"):
        return raw
    if kind.startswith("float"):
        try:
            return float(raw)
        except ValueError:
            raise UsageProblem(f"{name} must be a number, not {text!r}") from None
    units = _TIME_UNITS if name.endswith("_ms") else _SIZE_UNITS if "bytes" in name else {"": 1}
    number = raw.replace("_", "").lower()
    suffix = ""
    while number and not number[-1].isdigit():
        suffix = number[-1] + suffix
        number = number[:-1]
    if suffix.strip() not in units or not number.lstrip("-").isdigit():
        allowed = ", ".join(u for u in units if u) or "none"
        raise UsageProblem(f"{name} must be an integer (units: {allowed}), not {text!r}")
    return int(number) * units[suffix.strip()]


def parse_assignments(items: tuple[str, ...]) -> dict[str, Any]:
    """``("name=value", ...)`` to a config mapping (values typed per ``LogConfig``)."""
    changes: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageProblem(f"expected NAME=VALUE, not {item!r}")
        changes[name.strip()] = parse_config_value(name.strip(), value)
    return changes
