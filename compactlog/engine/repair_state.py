"""What ``repair`` does with damaged small files and segment headers: never a dead end.

Each function returns the lines ``repair`` reports and, unless ``dry_run``, makes the fix.
Nothing here deletes bytes: a file that cannot be read is moved aside as
``<name>.0.quarantine`` (``filenames.quarantine_name``) before anything replaces it.

- ``meta`` missing or unreadable (:func:`rebuild_meta`, only when the operator asks with
  ``--rebuild-meta``): the settings still legible in the damaged file are kept (it is
  JSON with one key per line, so a damaged byte costs the lines it touches), the log start
  is the first segment's base, and every setting that could not be recovered is named
  (its default is used).
- a subscriber checkpoint that cannot be read (:func:`repair_checkpoints`): moved aside
  and written anew at the log start, so the subscriber re-reads from there (records it had
  processed come again: at-least-once, never a record skipped), and ``consumed`` retention
  keeps holding the log for it. When even its name is lost (a ``cp.h.<sha256>`` file whose
  name cannot be read), it must be subscribed again, which starts at the log start too.
- ``cleaner.checkpoint`` that cannot be read (:func:`repair_cleaner_checkpoint`): moved
  aside; the cleaner starts over from the log start (it re-cleans what was clean already:
  more work, nothing lost).
- a segment file header that is not a segment header (:func:`rebuilt_header`): written
  anew; the batches behind it are then checked one by one as for any segment.
- the segment chain broken (:func:`repair_chain`): a segment gone is a loss accepted by
  relinking; a segment of another log (its offsets overlap the segment before it) is moved
  aside.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ..config import LogConfig
from ..encoding.format import (
    FILE_HEADER,
    FORMAT_VERSION,
    SEGMENT_FILE_HEADER,
    SEGMENT_MAGIC,
    check_file_header,
)
from ..errors import CompactLogError, ConfigError
from ..storage import filenames, segment_chain
from ..storage.fsio import FileSystem
from ..storage.log_identity import new_log_id
from ..storage.segment import Damage, list_segments, walk
from ..storage.state_files import (
    Meta,
    read_checkpoint_file,
    read_cleaner_state,
    read_meta,
    write_checkpoint,
    write_meta,
)

_LINE = re.compile(r'^\s*"([A-Za-z_]+)": (.*?),?\s*$')


def _quarantine(fs: FileSystem, directory: str, name: str) -> str:
    """Move ``name`` aside (an atomic rename, synced): its bytes stay for inspection."""
    target = filenames.quarantine_name(name, 0)
    fs.rename(os.path.join(directory, name), os.path.join(directory, target))
    fs.fsync_dir(directory)
    return target


def meta_problem(directory: str) -> str | None:
    """Why ``meta`` cannot be read (``None`` when it can). A ``meta`` of a newer format
    version is no damage: it is refused, never rebuilt."""
    try:
        read_meta(directory)
    except CompactLogError as error:
        if "newer than this compactlog supports" in str(error):
            raise
        return str(error)
    return None


def _salvage(data: bytes) -> dict[str, Any]:
    """The ``"name": value`` lines of a damaged ``meta`` that still parse (the whole
    document when it does)."""
    try:
        document = json.loads(data)
    except ValueError:
        document = None
    if isinstance(document, dict):
        found = {k: v for k, v in document.items() if k != "config"}
        if isinstance(document.get("config"), dict):
            found.update(document["config"])
        return found
    found = {}
    for line in data.decode("utf-8", "replace").splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        try:
            found[match.group(1)] = json.loads(match.group(2))
        except ValueError:
            continue
    return found


def rebuild_meta(
    fs: FileSystem, directory: str, *, dry_run: bool, source: str | None = None
) -> list[str]:
    """Write a new ``meta`` from what the damaged one still says, over ``source``'s (the
    ``meta`` of a snapshot or a backup of this log, when given), over the defaults. The log
    start is the first segment's base: the segments say where the log begins, and a damaged
    start could hide (and retention then delete) records that are there."""
    problem = meta_problem(directory)
    if problem is None:
        return []
    path = os.path.join(directory, filenames.META)
    data = b""
    if os.path.exists(path):
        with open(path, "rb") as handle:
            data = handle.read()
    salvaged = _salvage(data)
    config, log_id = LogConfig(), salvaged.get("log_id")
    lines = [f"meta: {problem}"]
    if source is not None:
        earlier = read_meta(os.path.abspath(source))
        config, log_id = earlier.config, log_id or earlier.log_id
        lines.append(f"took the settings of {os.path.join(source, filenames.META)}")
    kept: list[str] = []
    for name in LogConfig.names():
        if name not in salvaged:
            continue
        try:
            config = config.merged({name: salvaged[name]})
        except (ConfigError, TypeError, ValueError):
            continue
        kept.append(name)
    lost = [] if source is not None else [n for n in LogConfig.names() if n not in kept]
    bases = list_segments(directory)
    start = bases[0] if bases else 0
    fresh_id = not (isinstance(log_id, str) and re.fullmatch(r"[0-9a-f]{32}", log_id))
    meta = Meta(config=config, log_start_offset=start, log_id=new_log_id() if fresh_id else log_id)
    if data:
        lines.append(f"moved the damaged meta to {filenames.quarantine_name(filenames.META, 0)}")
    values = ", ".join(f"{n}={getattr(config, n)!r}" for n in kept)
    lines.append(
        f"rebuilt meta: log start {start} (the first segment's base); "
        + (f"settings read from the damaged meta (check them): {values}" if kept else "")
    )
    if lost:
        lines.append(
            f"settings not recovered, defaults used (check them, `compactlog config set` "
            f"changes them): {', '.join(lost)}"
        )
    if fresh_id:
        lines.append("the log id was not recovered: a new one was given (disk tables rebuild)")
    if not dry_run:
        if data:
            _quarantine(fs, directory, filenames.META)
        write_meta(fs, directory, meta)
    return lines


def _checkpoint_subscriber(name: str, data: bytes) -> str | None:
    """The subscriber a damaged checkpoint file belongs to, when it can be told."""
    if not name.startswith(filenames.HASHED_CHECKPOINT_PREFIX):
        try:
            return bytes.fromhex(name[len(filenames.CHECKPOINT_PREFIX) :]).decode("utf-8")
        except ValueError:
            return None
    match = re.search(rb'"subscriber": ("(?:[^"\\]|\\.)*")', data)
    if match is None:
        return None
    try:
        subscriber = json.loads(match.group(1))
    except ValueError:
        return None
    return subscriber if filenames.checkpoint_name(subscriber) == name else None


def repair_checkpoints(fs: FileSystem, directory: str, start: int, *, dry_run: bool) -> list[str]:
    """Move each unreadable subscriber checkpoint aside and restart it at ``start``."""
    lines = []
    for name in sorted(os.listdir(directory)):
        if filenames.parse_filename(name).kind is not filenames.FileKind.CHECKPOINT:
            continue
        try:
            read_checkpoint_file(directory, name)
            continue
        except CompactLogError as error:
            why = str(error)
        with open(os.path.join(directory, name), "rb") as handle:
            subscriber = _checkpoint_subscriber(name, handle.read())
        moved = filenames.quarantine_name(name, 0)
        if subscriber is None:
            lines.append(
                f"{why}: moved it to {moved}; the subscriber's name is lost: subscribe it "
                "again (it starts at the log start)"
            )
        else:
            lines.append(
                f"{why}: moved it to {moved} and reset subscriber {subscriber!r} to the log "
                f"start {start}: it reads again from there (records it had processed come "
                "again)"
            )
        if not dry_run:
            _quarantine(fs, directory, name)
            if subscriber is not None:
                write_checkpoint(fs, directory, subscriber, start)
    return lines


def repair_cleaner_checkpoint(fs: FileSystem, directory: str, *, dry_run: bool) -> list[str]:
    """Move an unreadable ``cleaner.checkpoint`` aside: the cleaner starts over."""
    try:
        read_cleaner_state(directory)
        return []
    except (CompactLogError, ValueError, TypeError) as error:
        why = str(error)
    name = filenames.CLEANER_CHECKPOINT
    if not dry_run:
        _quarantine(fs, directory, name)
    return [
        f"{name}: {why}: moved it to {filenames.quarantine_name(name, 0)}; the cleaner starts "
        "over from the log start (it cleans again what was clean: nothing is lost)"
    ]


def _offsets(directory: str, base: int) -> tuple[int, int] | None:
    """The first batch's base offset and the next offset after the last valid batch of
    segment ``base`` (``None``: it holds no valid batch)."""
    with open(os.path.join(directory, filenames.segment_name(base)), "rb") as handle:
        data = handle.read()
    headers = [h for _p, h in walk(data, FILE_HEADER.size, len(data)) if not isinstance(h, Damage)]
    return (headers[0].base_offset, headers[-1].next_offset) if headers else None


def _stray(directory: str, hole: segment_chain.Break) -> bool:
    """Whether the segment a link skips over is another log's: its records overlap those of
    the segment before it. (Else it is taken for this log's, and the link for the damage:
    a link has no checksum.)"""
    before, found = _offsets(directory, hole.base), _offsets(directory, hole.found)
    return before is not None and found is not None and found[0] < before[1]


def repair_chain(fs: FileSystem, directory: str, *, dry_run: bool) -> list[str]:
    """Make the segment chain whole (``segment_chain.py``): a segment that is gone is a loss
    accepted by linking the segment before it to the one after it; a segment of another log
    is moved aside with its index (``<name>.0.quarantine``)."""
    lines: list[str] = []
    for _ in range(len(list_segments(directory)) + 1):
        holes = segment_chain.find_breaks(directory, list_segments(directory))
        if not holes:
            break
        for hole in holes if dry_run else holes[:1]:
            if hole.expected > hole.found and _stray(directory, hole):
                name = filenames.segment_name(hole.found)
                lines.append(
                    f"{hole.message()}: its offsets overlap those of "
                    f"{filenames.segment_name(hole.base)}; moved it aside to "
                    f"{filenames.quarantine_name(name, 0)}"
                )
                if not dry_run:
                    index = filenames.index_name(hole.found)
                    if os.path.exists(os.path.join(directory, index)):
                        _quarantine(fs, directory, index)
                    _quarantine(fs, directory, name)
            else:
                lines.append(
                    f"{hole.message()}: accepted the loss, {filenames.segment_name(hole.base)} "
                    f"now links to {filenames.segment_name(hole.found)}"
                )
                if not dry_run:
                    segment_chain.relink(fs, directory, hole.base, hole.found)
        if dry_run:
            break
    return lines


def rebuilt_header(data: bytes) -> tuple[bytes, str] | None:
    """A new file header for a segment whose header is damaged, and why (``None``: the
    header is good, or of a newer format version, which is never overwritten)."""
    header = bytes(data[: FILE_HEADER.size])
    problem = check_file_header(header, SEGMENT_MAGIC)
    if problem is None or (
        len(header) == FILE_HEADER.size
        and header[:8] == SEGMENT_MAGIC
        and FILE_HEADER.unpack(header)[1] > FORMAT_VERSION
    ):
        return None
    return SEGMENT_FILE_HEADER, problem


__all__ = [
    "meta_problem",
    "rebuild_meta",
    "rebuilt_header",
    "repair_chain",
    "repair_checkpoints",
    "repair_cleaner_checkpoint",
]
