"""The small-run scanner: runs of consecutive small batches checked and decoded at once.

A log written by single appends is a file of one-record batches. Decoding each through
the columnar path (``batch_decode.decode_batch``) costs a dozen numpy calls per record;
instead, readers take a run of consecutive small batches at once: :func:`scan_small_run`
walks them by their length fields, checks every batch's own CRC for the whole run at once
(``row_crcs.rows_crcs`` for batches of one length, one crc32c call per body otherwise),
checks their headers together, and :func:`decode_small_run` returns the run as one
RecordBatch whose columns are the concatenation of the batches' columns (the records,
offsets, timestamps and headers of ``decode_batch`` for each batch, in order). Runs of
batches alike (records of one size, the commonest log of single appends) take shorter
paths still: their header fields are checked as a few words per batch
(:func:`_check_alike`), their CRC messages gathered into a per-thread scratch buffer
(``row_crcs._messages_crcs``), and their blobs copied as one column range of the rows
each (:func:`_decode_alike`).

A run starts at a small batch and goes on through the batches after it whatever their
size: a writer that mixes batches among its single appends (an ``append_batch`` every
few appends) would otherwise cut its log into short runs, each paying a run's fixed
costs, and such a log read 13-45 times slower than the same records appended one way
(issue 24). Runs of every kind are decoded at once (:func:`_decode_any`), and the CRCs
of a run whose lengths vary are computed a length at a time (:func:`_varied_crcs`).
"""

from __future__ import annotations

import mmap
import struct
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

from .batch_decode import RecordBatch
from .byte_items import cells, items_at, struct_layout
from .format import (
    BATCH_HEADER,
    BATCH_HEADER_DTYPE,
    BATCH_MAGIC,
    BODY_LENGTH_AT,
    CODEC_NONE,
    CODEC_ZSTD,
    COUNT_AT,
    CRC_START,
    FLAG_CONTIGUOUS,
    FLAG_HEADERS,
    FLAG_SINGLE_TIMESTAMP,
    KNOWN_FLAGS,
    LAST_DELTA_AT,
    TWO_LENGTHS,
    BatchHeader,
    crc32c,
    header_fields,
    zstd_decompress,
)
from .row_crcs import continue_crc, rows_crcs

SMALL_BATCH_RECORDS = 8
"""A batch of at most this many records is *small* (typically one single append)."""
_SIMPLE_FLAGS = FLAG_SINGLE_TIMESTAMP | FLAG_CONTIGUOUS


@dataclass(slots=True)
class SmallRun:
    """Consecutive whole, valid batches found by :func:`scan_small_run`: a small one,
    then batches of any size."""

    positions: np.ndarray  # int64 byte positions in the buffer scanned
    headers: np.ndarray  # their headers (structured, ``BATCH_HEADER_DTYPE``)
    end: int  # position just after the last batch
    length: int = 0  # the one length of every batch, 0 when they differ
    simple: bool = False  # known: every batch is one uncompressed record, flags alike
    bases: np.ndarray | None = None  # the base offsets (int64), where already gathered

    def __len__(self) -> int:
        return len(self.positions)


# batch header bytes [8, 12) as one little-endian word: magic, codec, flags. A word passes
# check_batch's field checks when its magic is BATCH_MAGIC and no bit outside the codecs
# (0, 1) and the known flags is set
_WORD_MASK = 0xFF | ((0xFF ^ CODEC_ZSTD) << 8) | ((0xFFFF ^ KNOWN_FLAGS) << 16)
assert CODEC_NONE == 0 and CODEC_ZSTD == 1  # the codecs the mask lets through
_SIMPLE_WORDS = (
    BATCH_MAGIC | (_SIMPLE_FLAGS << 16),
    BATCH_MAGIC | ((_SIMPLE_FLAGS | FLAG_HEADERS) << 16),
)


def scan_small_run(
    buf: bytes | memoryview | Any,
    pos: int,
    end: int,
    max_records: int = 1 << 62,
    max_bytes: int = 1 << 62,
) -> SmallRun | None:
    """The run of consecutive batches starting at ``pos`` with a small one (the batches
    after it of any size, see :func:`_walk`), or ``None`` when fewer than two are there.

    Every batch of the run passes exactly the checks of :func:`check_batch`, done for the
    whole run at once where they can be: the run's batches are found by their lengths
    (:func:`_walk`); the CRCs of a run of one batch length are computed together
    (:func:`rows_crcs`), else a length at a time (:func:`_varied_crcs`); every batch's CRC is
    compared with its own stored CRC, and the header fields are checked as columns (as
    two words per batch where every batch has the first one's fields, :func:`_check_alike`).
    The run stops before the first batch that is not whole below ``end``, not valid (left
    to :func:`check_batch`, which says why), whose offsets do not follow the previous
    one's, or that would take it past ``max_bytes`` bytes or ``max_records`` records. The
    run's ``headers`` are a view of ``buf`` where its batches have one length.
    """
    header_size = BATCH_HEADER.size
    stop = min(end, pos + max_bytes)
    # a batch holds at least one record unless it is empty: at most max_records batches
    # (cut to max_records records below)
    found, pos, length = _walk(buf, pos, stop, max(max_records, 2))
    n = len(found)
    if n < 2:
        return None
    raw = np.frombuffer(buf, dtype=np.uint8, count=pos)
    positions = np.asarray(found, dtype=np.int64)
    if length:
        # one batch length throughout (records of one size): the run is rows of one
        # length, the headers one strided column of them (a view: nothing is copied)
        first = int(positions[0])
        rows = raw[first:pos].reshape(n, length)
        headers = rows[:, :header_size].view(BATCH_HEADER_DTYPE)[:, 0]
        crcs = rows_crcs(rows)
        alike = _check_alike(rows, headers, crcs, max_records)
        if alike is not None:
            bad, simple, bases = alike
            return _cut(SmallRun(positions, headers, pos, length, simple, bases), bad)
    else:
        # lengths that vary: every header gathered as one 48-byte item, the CRCs computed
        # a length at a time (_varied_crcs)
        block = items_at(raw, positions, header_size).view(np.uint8).reshape(n, header_size)
        headers = block.view(BATCH_HEADER_DTYPE).ravel()
        crcs = _varied_crcs(buf, raw, positions, pos, block)
    count = headers["count"].astype(np.int64)
    bad = (
        (crcs != headers["crc"])
        | (headers["magic"] != BATCH_MAGIC)
        | (headers["codec"] > CODEC_ZSTD)
        | ((headers["flags"] & (0xFFFF ^ KNOWN_FLAGS)) != 0)
        | (count > headers["last_delta"].astype(np.int64) + 1)
    )
    bad[1:] |= (
        headers["base_offset"][1:] <= headers["base_offset"][:-1] + headers["last_delta"][:-1]
    )
    # (a run takes at least two batches; the second counts against max_records when it is
    # not small, so that a run of a single append and a large batch is no run)
    bad |= np.cumsum(count) > max(max_records, count[0] + min(count[1], SMALL_BATCH_RECORDS))
    return _cut(SmallRun(positions, headers, pos, length), bad)


_GROUP_ROWS = 64  # batches of one length that _varied_crcs takes as rows


def _varied_crcs(
    buf: Any, raw: np.ndarray, positions: np.ndarray, end: int, block: np.ndarray
) -> np.ndarray:
    """The CRC of every batch of a run whose lengths vary, as :func:`rows_crcs` does for
    rows of one length: the batches of a length that at least an eighth of them share (the
    single appends of a log that mixes in batches) are gathered as rows of that length and
    go through :func:`rows_crcs`; the others (records of varied sizes) have each body
    cut out as a bytes object by one struct unpack (no slice object per batch), its CRC
    one crc32c call, continued over its header for all of them at once."""
    header_size = BATCH_HEADER.size
    lengths = np.diff(positions, append=end)
    crcs = np.empty(len(positions), dtype=np.uint32)
    alone = np.ones(len(positions), dtype=bool)
    found, counts = np.unique(lengths, return_counts=True)
    # (a length only a few batches share is not worth a pass of its own)
    for length in found[counts >= max(_GROUP_ROWS, len(positions) // 8)].tolist():
        rows = np.flatnonzero(lengths == length)
        gathered = items_at(raw, positions[rows], length).view(np.uint8)
        crcs[rows] = rows_crcs(gathered.reshape(len(rows), length))
        alone[rows] = False
    rest = np.flatnonzero(alone)
    if len(rest):
        starts = positions[rest] + header_size
        sizes = lengths[rest] - header_size
        skips = starts - np.append(starts[0], (starts + sizes)[:-1])
        layout = struct_layout((skips, b"x"), (sizes, b"s"), count=len(rest))
        bodies = layout.unpack_from(buf, int(starts[0]))
        body_crcs = np.frombuffer(array("I", map(crc32c, bodies)), dtype=np.uint32)
        crcs[rest] = continue_crc(body_crcs, block[rest, CRC_START:])
    return crcs


def _check_alike(
    rows: np.ndarray, headers: np.ndarray, crcs: np.ndarray, max_records: int
) -> tuple[np.ndarray, bool, np.ndarray] | None:
    """:func:`scan_small_run`'s checks for a run whose batches all have the first one's
    magic, codec, flags, count and last delta (single appends of records of one size),
    in fewer numpy passes: those fields compared once as two words per batch, and the
    first batch's fields checked as :func:`check_batch` does. Returns where a batch is bad
    (its CRC, its offsets, or past ``max_records``), whether every batch is one
    uncompressed record with one timestamp and contiguous offsets, and the base offsets
    (gathered once into a contiguous array, for the offsets check and the decoder);
    ``None`` when the fields differ between batches (the general checks then run)."""
    words = rows[:, CRC_START : CRC_START + 4].view("<u4")[:, 0]
    counts = rows[:, COUNT_AT : COUNT_AT + 8].view("<u8")[:, 0]  # count, then last_delta
    word, both = int(words[0]), int(counts[0])
    count, last_delta = both & 0xFFFFFFFF, both >> 32
    if word & _WORD_MASK != BATCH_MAGIC or count > last_delta + 1:
        return None
    if not bool((words == word).all() and (counts == both).all()):
        return None
    bases = headers["base_offset"].astype(np.int64)
    bad = crcs != headers["crc"]
    bad[1:] |= bases[1:] <= bases[:-1] + last_delta
    # np.cumsum(count) > max(max_records, 2 * count), for one count per batch
    limit = max(max_records, 2 * count)
    if count and len(bad) * count > limit:
        bad[limit // count :] = True
    return bad, count == 1 and word in _SIMPLE_WORDS, bases


def _cut(run: SmallRun, bad: np.ndarray) -> SmallRun | None:
    """``run`` up to its first bad batch (``None`` when fewer than two are left)."""
    if not bool(bad.any()):
        return run
    n = int(np.argmax(bad))
    if n < 2:
        return None
    run.end = int(run.positions[n])
    run.positions, run.headers = run.positions[:n], run.headers[:n]
    if run.bases is not None:
        run.bases = run.bases[:n]
    return run


_LENGTH = header_fields("length")
_COUNT = header_fields("count")
_LEAP_AFTER = 8  # equal lengths in a row before _walk tries a leap
_LEAP_ROWS = 256  # batches the first leap looks at; each leap that takes them all doubles it


def _walk(
    buf: Any, pos: int, stop: int, max_batches: int
) -> tuple[np.ndarray | list[int], int, int]:
    """Positions of consecutive small batches whose lengths keep them whole below
    ``stop`` (nothing else is checked here), where they end, and their one length when
    they all have one (each length field was read, or leapt over as equal to it), else 0.
    The positions are an int64 array (an empty list when there is no batch).

    The first batch must be small (a run starts at a single append); the batches after
    it may hold any number of records, so that the batches a writer mixes in among its
    single appends do not cut the run (each cut costs a run's fixed costs again, and a
    batch every 16 single appends made reads 30 times slower).

    Batches are found one length field at a time; after :data:`_LEAP_AFTER` equal
    lengths in a row (single appends of records of one size), the length fields of the
    batches that would follow at that spacing are read as one numpy column and the walk
    leaps over every one that matches, looking :data:`_LEAP_ROWS` batches ahead and
    twice as far after each leap that took them all (never the whole rest of the
    buffer: a run that soon changes length would pay for it at every leap). The
    positions of a leap are never made one by one: a run of one length is an
    ``arange``. At the first length that differs from the one before (records of varied
    sizes, or a batch among single appends), the rest is walked by :func:`_chase`.
    """
    first = pos
    found: list[int] = []  # positions stepped on since the last leap
    append = found.append
    parts: list[np.ndarray] = []  # the positions before those, in order
    taken = 0  # how many positions ``parts`` holds
    unpack = _LENGTH.unpack_from
    last = stop - BATCH_HEADER.size
    header_size = BATCH_HEADER.size
    if pos > last or _COUNT.unpack_from(buf, pos + COUNT_AT)[0] > SMALL_BATCH_RECORDS:
        return found, pos, 0
    previous = -1
    uniform = True
    same = 0
    leap_after = _LEAP_AFTER
    window = _LEAP_ROWS
    raw: np.ndarray | None = None
    for _ in range(max_batches):  # one batch found per turn (and a leap adds many)
        if pos > last:
            break
        (length,) = unpack(buf, pos)
        following = pos + length
        if not pos + header_size <= following <= stop:
            break
        append(pos)
        pos = following
        if length != previous:
            if previous >= 0:
                # lengths vary (records of varied sizes): step on through the rest
                uniform = False
                parts.append(np.array(found, dtype=np.int64))
                taken += len(found)
                found.clear()
                pos = _chase(buf, pos, stop, max_batches - taken, parts, found)
                break
            previous = length
            same = 0
        elif same + 1 < leap_after:
            same += 1
        else:
            same = 0
            if raw is None:
                raw = np.frombuffer(buf, dtype=np.uint8, count=stop)
            room = min((stop - pos) // length, max_batches - taken - len(found))
            rows = min(room, window)
            if rows <= 0:
                continue  # no room for another batch of this length: walk on
            # the length field of each would-be batch, as a strided view
            matching = np.ndarray((rows,), "<u4", raw, pos, (length,)) == length
            leap = rows if bool(matching.all()) else int(np.argmin(matching))
            if leap < leap_after:
                leap_after *= 2  # lengths only look alike: try less often
            elif leap == window < room:
                window *= 2  # all alike so far: leap on at once, twice as far
                same = leap_after - 1
            if leap:
                parts.append(np.array(found, dtype=np.int64))
                parts.append(np.arange(pos, pos + leap * length, length, dtype=np.int64))
                taken += len(found) + leap
                found.clear()
                pos += leap * length
                if taken >= max_batches:
                    break
    positions: np.ndarray | list[int] = found
    if uniform and previous > 0:  # (one arange rather than the parts joined)
        positions = np.arange(first, pos, previous, dtype=np.int64)
    elif not uniform:
        positions = np.frombuffer(array("q", found), dtype=np.int64)
        if parts:
            positions = np.concatenate([*parts, positions])
    elif parts:
        positions = np.concatenate([*parts, np.array(found, dtype=np.int64)])
    if len(positions) > max_batches:  # (steps after a leap)
        pos = int(positions[max_batches])
        positions = positions[:max_batches]
    return positions, pos, previous if uniform and previous > 0 else 0


def _step(buf: Any, pos: int, stop: int, turns: int, found: list[int]) -> int:
    """:func:`_walk` for lengths that vary: up to ``turns`` more batches whose lengths
    keep them whole below ``stop``, found one length field at a time, their positions
    appended to ``found``; returns where they end. The count fields are left to the
    caller, which checks them for all these batches at once.

    Why a loop of its own: the fewest Python operations per batch (one ``unpack_from``,
    two comparisons), about 2/3 of the cost of :func:`_walk`'s loop, which also tracks
    equal lengths for its leaps."""
    unpack = _LENGTH.unpack_from
    header_size = BATCH_HEADER.size
    append = found.append
    try:
        for _ in range(turns):
            (length,) = unpack(buf, pos)
            following = pos + length
            if length < header_size or following > stop:
                break
            append(pos)
            pos = following
    except struct.error:  # fewer than 4 bytes left in the buffer
        pass
    return pos


_CHASE_SPACING = 4096  # bytes between the places where _chase starts a chain
_CHASE_MIN_BYTES = 8 * _CHASE_SPACING  # less to walk: _step alone


def _chase(
    buf: Any, pos: int, stop: int, turns: int, parts: list[np.ndarray], found: list[int]
) -> int:
    """:func:`_step`, the length fields followed by numpy along many chains at once:
    the positions it finds are appended to ``parts`` as arrays (and to ``found`` where
    it falls back to :func:`_step`); returns where they end.

    Why: following the lengths one batch at a time costs about 130 ns a batch in Python.
    Here the walk starts anew :data:`_CHASE_SPACING` bytes after each start, at the
    first place after that which looks like the start of a batch (the batch at ``pos``'s count and
    last-delta bytes, found by ``find``, with a length that matches its body length),
    and all those chains are followed together, one numpy step for one batch of each.
    Nothing found this way is trusted: chain ``j`` (from the true ``pos`` for the
    first) must land exactly on the start of chain ``j + 1``, so every position is the
    one a walk from ``pos`` reaches, with the same checks (a length of at least a
    header, the batch whole below ``stop``). Where a chain ends elsewhere (a start
    that only looked like a batch) the chains after it are dropped and :func:`_step`
    walks on from where it ended; where a batch fails the checks, the walk ends there.
    """
    header_size = BATCH_HEADER.size
    if (
        stop - pos < _CHASE_MIN_BYTES
        or turns < (stop - pos) // header_size + 1
        or not isinstance(buf, bytes | mmap.mmap)
    ):
        return _step(buf, pos, stop, turns, found)
    raw = np.frombuffer(buf, dtype=np.uint8)
    fields = np.ndarray((len(raw) - 3,), "<u4", raw, 0, (1,))  # a u4 at every byte
    # where a chain may be read (past ``stop`` for the chains that are done): a position
    # in the last 3 bytes reads the u4 before it instead, and such a batch fails the
    # checks below whatever it reads (no room for a header before ``stop``)
    limit = len(raw) - 4
    pattern = buf[pos + COUNT_AT : pos + LAST_DELTA_AT + 4]  # count and last delta
    find = buf.find
    starts = [pos]
    at = pos + _CHASE_SPACING
    while at < stop - header_size:
        hit = find(pattern, at + COUNT_AT, stop)
        if hit < 0:
            break
        starts.append(hit - COUNT_AT)
        # the next search from a spacing past this hit, not from a spacing past ``at``: a
        # large batch in the run (no pattern in its body) is searched through once
        at = max(at, hit - COUNT_AT) + _CHASE_SPACING
    points = np.array(starts, dtype=np.int64)  # (ascending: each search starts past the last hit)
    # (a start whose length is not its body length + header is no simple batch: dropped)
    later = points[1:]
    later = later[later <= stop - header_size]
    looks = (fields[later] == fields[later + BODY_LENGTH_AT].astype(np.int64) + header_size) & (
        later + fields[later] <= stop
    )
    points = np.concatenate([points[:1], later[looks]])
    targets = np.append(points[1:], stop)
    # a chain of valid batches takes at most (its span // header_size) steps; one that
    # takes more has a bad length (checked below) and is stopped there
    steps = int((targets - points).max()) // header_size + 1
    at_ = points
    walked: list[np.ndarray] = []  # where each chain is before each step
    for step in range(steps):
        moving = at_ < targets
        if not step % 4 and not bool(moving.any()):  # (a step more costs less than asking)
            break
        walked.append(at_)
        # (a chain that is done stays where it is, and may be past the buffer: clipped)
        at_ = at_ + fields[np.minimum(at_, limit)] * moving
    # chains in order, up to the first that does not end on the next one's start; a
    # chain's positions are where it was before its steps while short of its target
    wrong = at_ != targets
    j = int(np.argmax(wrong)) if bool(wrong.any()) else len(points) - 1
    chained = np.stack([*walked, at_], axis=1)[: j + 1]
    short = chained[:, :-1] < targets[: j + 1, None]
    positions = chained[:, :-1][short]
    # the checks of _step, for every batch at once: the walk ends at the first that fails
    # (each batch's length is the step its chain took from it: no second gather)
    lengths = np.diff(chained, axis=1)[short]
    bad = np.flatnonzero((lengths < header_size) | (positions + lengths > stop))
    if bad.size:
        cut = int(bad[0])
        parts.append(positions[:cut])
        return int(positions[cut])
    parts.append(positions)
    end = int(at_[j])
    if bool(wrong[j]):
        # chain j passed the start of chain j + 1 (a start that only looked like one)
        end = _step(buf, end, stop, turns - len(positions), found)
    return end


def decode_small_run(buf: bytes | memoryview | Any, run: SmallRun) -> RecordBatch:
    """One :class:`RecordBatch` holding the records of every batch of ``run``.

    Its columns are the concatenation of what :func:`decode_batch` gives for each batch;
    ``header`` describes the run as a whole (``length`` its bytes, ``base_offset`` the
    first batch's, ``last_delta`` up to the last batch's last offset, ``count`` every
    record; ``codec``, ``flags`` and ``crc`` 0 as the columns are explicit),
    ``position`` is the first batch's and ``stored_batches`` the number of batches.
    Raises ``ValueError`` when a batch's columns do not add up to its body, or the
    decompressor's error for a body that does not decompress (callers then decode the
    batches one by one to report which).
    """
    if run.simple and run.length:
        batch = _decode_alike(buf, run)
        if batch is not None:
            return batch
    headers = run.headers
    simple = (
        (headers["codec"] == CODEC_NONE)
        & (headers["count"] == 1)
        & ((headers["flags"] | FLAG_HEADERS) == (_SIMPLE_FLAGS | FLAG_HEADERS))
    )
    if bool(simple.all()):
        return _decode_simple(buf, run.positions, headers, run.end)
    return _decode_any(buf, run)


def _decode_any(buf: bytes | memoryview | Any, run: SmallRun) -> RecordBatch:
    """:func:`decode_small_run` for any run (batches of many records, compressed bodies,
    offset deltas, timestamp columns, headers), every batch's columns read at once.

    Why: a writer that mixes batches among its single appends makes runs of every kind,
    and decoding them batch by batch (``decode_batch``, a dozen numpy calls each) made such
    logs read 30 times slower than the same records appended one way. Here the bodies
    (decompressed where they are compressed, then joined) are read as columns: each
    record's batch and place in it come from ``np.repeat``, and each length, delta and
    timestamp is one gather at the position the batch grammar (``format.py``) gives it;
    the blobs of every batch are cut out by one struct unpack."""
    headers = run.headers
    n = len(run)
    header_size = BATCH_HEADER.size
    positions = run.positions
    first = int(positions[0])
    counts = headers["count"].astype(np.int64)
    body_lengths = headers["body_length"].astype(np.int64)
    stored = np.diff(positions, append=run.end) - header_size  # bytes of each stored body
    compressed = headers["codec"] != CODEC_NONE
    data: Any = buf
    starts = positions + header_size
    if bool(compressed.any()):
        bodies = struct_layout((b"%d" % header_size, b"x"), (stored, b"s"), count=n)
        sizes = body_lengths.tolist()
        plain = [
            zstd_decompress(body, size) if packed else body
            for body, size, packed in zip(
                bodies.unpack_from(buf, first), sizes, compressed.tolist(), strict=True
            )
        ]
        if sizes != list(map(len, plain)):
            raise ValueError("a body's length differs from its header's")
        data = b"".join(plain)
        starts = np.cumsum(body_lengths) - body_lengths
    elif not bool((stored == body_lengths).all()):
        raise ValueError("a body's length differs from its header's")
    flags = headers["flags"]
    stamped = (flags & FLAG_SINGLE_TIMESTAMP) == 0  # a timestamp column
    spaced = (flags & FLAG_CONTIGUOUS) == 0  # an offset delta column
    with_headers = (flags & FLAG_HEADERS) != 0  # a header length column
    # where each column starts in its body (format.py's body grammar)
    at_deltas = 8 * counts * stamped
    at_keys = at_deltas + 4 * counts * spaced
    at_values = at_keys + 4 * counts
    at_headers = at_values + 4 * counts
    at_blobs = at_headers + 4 * counts * with_headers
    if not bool((at_blobs <= body_lengths).all()):
        raise ValueError("column lengths do not add up to the batch body")
    total = int(counts.sum())
    ends = np.cumsum(counts)
    batch = np.repeat(np.arange(n), counts)  # each record's batch
    within = np.arange(total, dtype=np.int64) - (ends - counts)[batch]  # its place in it
    column = starts[batch] + 4 * within  # its item in a column of 4-byte items
    raw = np.frombuffer(data, dtype=np.uint8)
    words = np.ndarray((len(raw) - 3,), "<i4", raw, 0, (1,))  # an i4 at every byte
    key_lengths = words[column + at_keys[batch]]
    value_lengths = words[column + at_values[batch]]
    bases = headers["base_offset"].astype(np.int64)
    offsets = bases[batch] + within
    if bool(spaced.any()):
        has = spaced[batch]
        deltas = words[(column + at_deltas[batch])[has]].view(np.uint32)
        offsets[has] = bases[batch[has]] + deltas
    timestamps = headers["first_ts"].astype(np.int64)[batch]
    if bool(stamped.any()):
        has = stamped[batch]
        quads = np.ndarray((len(raw) - 7,), "<i8", raw, 0, (1,))  # an i8 at every byte
        timestamps[has] = quads[(starts[batch] + 8 * within)[has]]
    header_lengths = None
    if bool(with_headers.any()):
        has = with_headers[batch]
        header_lengths = np.zeros(total, dtype=np.int32)
        header_lengths[has] = words[(column + at_headers[batch])[has]]
        if int(header_lengths.min(initial=0)) < 0:
            raise ValueError("a negative header length")
    # each batch's blobs follow its columns: its keys, values and headers, back to back
    blob_columns = [key_lengths, value_lengths]
    if header_lengths is not None:
        blob_columns.append(header_lengths)
    widths = [_one_width(lengths) for lengths in blob_columns]
    totals = [
        counts * width if width is not None else _sums(lengths, ends)
        for lengths, width in zip(blob_columns, widths, strict=True)
    ]
    if not bool((sum(totals) + at_blobs == body_lengths).all()):
        raise ValueError("column lengths do not add up to the batch body")
    region = starts + at_blobs  # where each batch's blob of the column at hand starts
    blobs = []
    for width, per_batch in zip(widths, totals, strict=True):
        if width is not None:
            # items of one width (keys or values of one size): one gather
            at = region[batch] + width * within
            blobs.append(items_at(raw, at, width).tobytes() if width and total else b"")
        else:
            # one piece per batch, cut out by one struct unpack
            skips = region - np.append(region[0], (region + per_batch)[:-1])
            layout = struct_layout((skips, b"x"), (per_batch, b"s"), count=n)
            blobs.append(b"".join(layout.unpack_from(data, int(region[0]))))
        region = region + per_batch
    header = BatchHeader(
        run.end - first,
        0,
        BATCH_MAGIC,
        CODEC_NONE,
        0,
        int(bases[0]),
        total,
        int(bases[-1]) + int(headers["last_delta"][-1]) - int(bases[0]),
        int(headers["first_ts"][0]),
        int(headers["max_ts"].max()),
        0,
    )
    return RecordBatch(
        header,
        first,
        offsets,
        timestamps,
        key_lengths,
        value_lengths,
        blobs[0],
        blobs[1],
        header_lengths,
        blobs[2] if header_lengths is not None else None,
        n,
    )


def _one_width(lengths: np.ndarray) -> int | None:
    """The one length of every item (none absent), or ``None`` when they differ."""
    if not len(lengths):
        return 0
    width = int(lengths[0])
    return width if width >= 0 and bool((lengths == width).all()) else None


def _sums(values: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The sums of ``max(values, 0)`` over each batch's records (``ends``: cumulative counts)."""
    totals = np.cumsum(np.maximum(values, 0), dtype=np.int64)
    at = totals[np.maximum(ends - 1, 0)] if len(totals) else np.zeros(len(ends), np.int64)
    at = np.where(ends > 0, at, 0)
    return np.diff(at, prepend=0)


def _decode_alike(buf: bytes | memoryview | Any, run: SmallRun) -> RecordBatch | None:
    """:func:`_decode_simple` for the commonest run: batches of one length (known
    simple, flags alike), no headers, and every record with the first one's key and
    value lengths, neither absent. The lengths are then two numbers: they are checked
    against every batch's length columns and body length in two comparisons, and each
    blob is one column range of the rows. ``None`` for any other run."""
    n, length = len(run), run.length
    headers = run.headers
    header_size = BATCH_HEADER.size
    body = length - header_size
    if int(headers["flags"][0]) & FLAG_HEADERS:
        return None
    first = int(run.positions[0])
    rows = np.frombuffer(buf, dtype=np.uint8, count=run.end)[first:].reshape(n, length)
    # key and value lengths as one 8-byte word per batch: one comparison checks both
    pair = rows[:, header_size : header_size + 8].view("<u8")[:, 0]
    both = int(pair[0])
    key_length, value_length = TWO_LENGTHS.unpack(both.to_bytes(8, "little"))
    if key_length < 0 or value_length < 0 or 8 + key_length + value_length != body:
        return None
    if not bool((pair == both).all() and (headers["body_length"] == body).all()):
        return None
    at = header_size + 8
    keys = rows[:, at : at + key_length]
    values = rows[:, at + key_length :]
    base = headers["base_offset"].astype(np.int64) if run.bases is None else run.bases
    timestamps = headers["first_ts"].astype(np.int64)
    header = BatchHeader(
        run.end - first,
        0,
        BATCH_MAGIC,
        CODEC_NONE,
        0,
        int(base[0]),
        n,
        int(base[-1]) + int(headers["last_delta"][-1]) - int(base[0]),
        int(timestamps[0]),
        int(headers["max_ts"].max()),
        0,
    )
    return RecordBatch(
        header,
        first,
        base,
        timestamps,
        np.full(n, key_length, dtype=np.int32),
        np.full(n, value_length, dtype=np.int32),
        cells(keys).tobytes() if key_length else b"",
        cells(values).tobytes() if value_length else b"",
        None,
        None,
        n,
    )


def _decode_simple(
    buf: bytes | memoryview | Any, positions: np.ndarray, headers: np.ndarray, end: int
) -> RecordBatch:
    """The columns of one-record, uncompressed, one-timestamp batches, gathered at once."""
    n = len(positions)
    header_size = BATCH_HEADER.size
    raw = np.frombuffer(buf, dtype=np.uint8, count=end)
    has_headers = (headers["flags"] & FLAG_HEADERS) != 0
    any_headers = bool(has_headers.any())
    columns = 8 + 4 * has_headers.astype(np.int64)
    body = headers["body_length"].astype(np.int64)
    if not bool(
        (body == headers["length"].astype(np.int64) - header_size).all() and (body >= columns).all()
    ):
        raise ValueError("column lengths do not add up to the batch body")
    lengths = items_at(raw, positions + header_size, 8).view("<i4")
    key_lengths = np.ascontiguousarray(lengths[0::2])
    value_lengths = np.ascontiguousarray(lengths[1::2])
    header_lengths = np.zeros(n, dtype=np.int32)
    if any_headers:
        at = positions[has_headers] + header_size + 8
        header_lengths[has_headers] = items_at(raw, at, 4).view("<i4")
    klen = np.maximum(key_lengths, 0).astype(np.int64)
    vlen = np.maximum(value_lengths, 0).astype(np.int64)
    sizes = columns + klen + vlen + header_lengths
    if not bool((header_lengths >= 0).all() and (sizes == body).all()):
        raise ValueError("column lengths do not add up to the batch body")
    hlen = header_lengths.astype(np.int64)
    length = int(headers["length"][0])
    first = int(positions[0])
    if (
        end - first == n * length
        and _same(columns)
        and _same(klen)
        and _same(vlen)
        and _same(hlen)
        and _same(np.diff(positions))
    ):
        # every batch alike (records of one size): the run is a 2-D array of rows and each
        # blob a column range of it
        rows = raw[first:end].reshape(n, length)
        at = header_size + int(columns[0])
        k, v, h = int(klen[0]), int(vlen[0]), int(hlen[0])
        keys_blob = rows[:, at : at + k].tobytes()
        values_blob = rows[:, at + k : at + k + v].tobytes()
        headers_blob = rows[:, at + k + v : at + k + v + h].tobytes() if any_headers else None
    elif not any_headers and _same(klen):
        # the run is its batches back to back, each exactly header + columns + key +
        # value + headers (checked above). Keys of one length (the common case): each key
        # is one fixed-width item; the values are cut out by one struct unpack that skips
        # every header, columns and key (the skip is then one number)
        k = int(klen[0])
        at = positions + header_size + 8
        keys_blob = items_at(raw, at, k).tobytes() if k else b""
        skip = b"%d" % (header_size + 8 + k)
        values = struct_layout((skip, b"x"), (vlen, b"s"), count=n).unpack_from(buf, first)
        values_blob = b"".join(values)
        headers_blob = None
    else:
        # any layout: one struct unpack yields every key, value and headers blob
        columns_ = [(header_size + columns, b"x"), (klen, b"s"), (vlen, b"s")]
        if any_headers:
            columns_.append((hlen, b"s"))
        pieces = struct_layout(*columns_, count=n).unpack_from(buf, first)
        step = len(columns_) - 1
        keys_blob = b"".join(pieces[0::step])
        values_blob = b"".join(pieces[1::step])
        headers_blob = b"".join(pieces[2::step]) if any_headers else None
    base = headers["base_offset"]
    header = BatchHeader(
        end - int(positions[0]),
        0,
        BATCH_MAGIC,
        CODEC_NONE,
        0,
        int(base[0]),
        n,
        int(base[-1]) + int(headers["last_delta"][-1]) - int(base[0]),
        int(headers["first_ts"][0]),
        int(headers["max_ts"].max()),
        0,
    )
    return RecordBatch(
        header,
        int(positions[0]),
        base.astype(np.int64),
        headers["first_ts"].astype(np.int64),
        key_lengths,
        value_lengths,
        keys_blob,
        values_blob,
        header_lengths if any_headers else None,
        headers_blob,
        n,
    )


def _same(values: np.ndarray) -> bool:
    return not len(values) or bool((values == values[0]).all())
