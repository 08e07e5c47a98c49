"""The segment chain: each closed segment names the segment that follows it.

A log must know its own files: a closed segment deleted by hand (with or without its
index) or a segment file copied in from elsewhere must be found, never skipped. Offsets
alone cannot tell: compaction drops batches and recovery leaves lost offsets unused, so a
gap between segments is normal. So a closed segment's file header carries a **link**: the
base offset of the next segment, stored as the span ``next_base - base`` in the header's
``reserved`` field (u32), with bit 0 of its ``flags`` (``LINKED``) saying it is there
(docs/format.md section 3.2). Older files have flags 0: no link, nothing checked.

Who writes links, so that they survive every legitimate removal of a segment:

- the writer's roll, into the segment it leaves, before the ``fdatasync`` that closes it
  (``writer._roll`` step 0): a closed segment is never written again;
- compaction's swap (``swap.replace_segments`` step 0): the rewrite of a group takes the
  link of the group's last segment, so it names the segment after the group;
- ``repair`` when it accepts a loss (:func:`relink`): the segment before a hole names the
  segment after it.

Retention removes segments from the front only, which no link names. While a swap is under
way (or interrupted, until the next writer or cleaner resolves it), the rewrite may already
link past the segments the swap is removing: the chain is whole without those. The newest segment
has no link (nothing follows it yet), and its predecessor's link may name a segment that a
power loss took back before its directory entry was synced (docs/format.md 10.1): the
newest segment's own link is therefore never checked against a successor that is absent.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..encoding.format import FILE_HEADER, SEGMENT_MAGIC
from ..errors import MissingSegmentError
from . import filenames
from .fsio import FileSystem
from .segment import list_segments
from .state_files import read_meta
from .swap_intent import read_intent

LINKED = 1  # file header flags bit 0: ``reserved`` holds the span to the next segment
LINK_AT = 10  # flags u16 and reserved u32 are bytes [10, 16) of the file header
_LINK = FILE_HEADER  # (magic, version, flags, reserved)
MAX_SPAN = (1 << 32) - 1
CHECK_ATTEMPTS = 3  # a listing raced by a compaction swap is taken again this often


def next_base(header: bytes, base: int) -> int | None:
    """The next segment's base that a segment file header names (``None``: no link)."""
    if len(header) < FILE_HEADER.size or header[: len(SEGMENT_MAGIC)] != SEGMENT_MAGIC:
        return None
    _magic, _version, flags, span = _LINK.unpack_from(header)
    return base + span if flags & LINKED and span > 0 else None


def link_bytes(base: int, following: int | None) -> bytes:
    """Bytes [10, 16) of a segment header linking ``base`` to ``following`` (no link when
    ``following`` is ``None`` or too far for a u32 span)."""
    span = 0 if following is None else following - base
    if not 0 < span <= MAX_SPAN:
        return bytes(6)
    return LINKED.to_bytes(2, "little") + span.to_bytes(4, "little")


def with_link(header: bytes, base: int, following: int | None) -> bytes:
    """``header`` (a whole segment file header) with its link set to ``following``."""
    return header[:LINK_AT] + link_bytes(base, following) + header[FILE_HEADER.size :]


def stamp(fs: FileSystem, fd: int, base: int, following: int | None) -> None:
    """Write the link into the header of the open segment ``base`` (the caller syncs it)."""
    fs.pwrite(fd, link_bytes(base, following), LINK_AT)


def read_header(directory: str, base: int) -> bytes | None:
    """The first 16 bytes of segment ``base`` (``None``: the file is gone)."""
    try:
        fd = os.open(os.path.join(directory, filenames.segment_name(base)), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.pread(fd, FILE_HEADER.size, 0)
    finally:
        os.close(fd)


def relink(fs: FileSystem, directory: str, base: int, following: int | None) -> None:
    """Make segment ``base`` name ``following`` (repair accepting a hole), synced."""
    fd = fs.open(os.path.join(directory, filenames.segment_name(base)), os.O_RDWR)
    try:
        stamp(fs, fd, base, following)
        fs.fsync(fd)
    finally:
        fs.close(fd)


@dataclass(frozen=True)
class Break:
    """Segment ``base`` names ``expected`` as its successor, but ``found`` follows it."""

    base: int
    expected: int
    found: int

    @property
    def file(self) -> str:
        """The file to blame: the missing one, or the one that should not be there."""
        return filenames.segment_name(min(self.expected, self.found))

    def message(self) -> str:
        expected = filenames.segment_name(self.expected)
        if self.expected < self.found:
            return (
                f"segment {expected} is missing: {filenames.segment_name(self.base)} is "
                f"followed by it, so offsets {self.expected} to {self.found - 1} are lost"
            )
        return (
            f"segment {filenames.segment_name(self.found)} is not one of this log's: "
            f"{filenames.segment_name(self.base)} is followed by {expected}"
        )


def breaks(bases: Sequence[int], headers: Sequence[bytes | None]) -> list[Break]:
    """Every pair of neighbours whose link disagrees with the listing (pure)."""
    found = []
    for i in range(len(bases) - 1):
        header = headers[i]
        following = next_base(header, bases[i]) if header is not None else None
        if following is not None and following != bases[i + 1]:
            found.append(Break(bases[i], following, bases[i + 1]))
    return found


def find_breaks(directory: str, bases: Sequence[int]) -> list[Break]:
    """:func:`breaks` of the segments ``bases`` as they are on disk."""
    return breaks(bases, [read_header(directory, b) for b in bases[:-1]])


def problems(directory: str, bases: Sequence[int], log_start: int) -> list[tuple[str, str]]:
    """``(file, message)`` for each segment missing or foreign among ``bases``: the first
    one when it starts past the log start (retention moves the log start before it removes
    segments), and every :class:`Break` of the chain. ``compactlog verify`` reports them;
    opens raise the first (:func:`check_chain`)."""
    found = []
    if bases and log_start < bases[0] and bases[0] > 0:
        found.append(
            (
                filenames.segment_name(log_start),
                f"the log starts at offset {log_start} but the first segment starts at "
                f"{bases[0]}: the segment(s) holding offsets {log_start} to {bases[0] - 1} "
                "are missing",
            )
        )
    found.extend((b.file, b.message()) for b in _chain_breaks(directory, bases))
    return found


def _chain_breaks(directory: str, bases: Sequence[int]) -> list[Break]:
    """:func:`find_breaks`, allowing for a compaction swap under way or interrupted: from
    its step 3 the group's rewrite links past the segments the swap then removes (the
    intent names them), so the chain is whole with or without them."""
    found = find_breaks(directory, bases)
    intent = read_intent(directory) if found else None
    if intent is not None:
        without = find_breaks(directory, [b for b in bases if b not in intent[1]])
        found = without if len(without) < len(found) else found
    return found


def check_chain(directory: str, log_start: int) -> None:
    """Raise :class:`MissingSegmentError` for the first of :func:`problems`: what every
    open checks. A compaction swap or retention between the listing and the headers can
    make a disagreement that is not there: it must hold on :data:`CHECK_ATTEMPTS` looks."""
    found: list[tuple[str, str]] = []
    for attempt in range(CHECK_ATTEMPTS):
        if attempt:
            log_start = read_meta(directory).log_start_offset  # (retention may have moved it)
        found = problems(directory, list_segments(directory), log_start)
        if not found:
            return
    raise MissingSegmentError(
        f"{found[0][1]}; run `compactlog repair {directory}` to accept the loss",
        path=os.path.join(directory, found[0][0]),
        position=0,
    )


__all__ = [
    "LINKED",
    "Break",
    "breaks",
    "check_chain",
    "find_breaks",
    "link_bytes",
    "next_base",
    "problems",
    "read_header",
    "relink",
    "stamp",
    "with_link",
]
