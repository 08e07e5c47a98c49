"""The CRCs of many stored batches at once, for the small-run scanner (``small_runs.py``).

Each batch's CRC is exactly what ``format.check_batch`` computes (``crc32c`` of the body,
continued over header bytes [8, 48)); here it is computed for a whole run together:
:func:`rows_crcs` for batches of one length (by table where few byte columns vary, else
one ``crc32c`` call per batch through a per-thread scratch buffer), :func:`continue_crc`
to continue the bodies' CRCs over the 40-byte header parts of many batches in one step
(both built on CRC-32C's linearity over GF(2)).
"""

from __future__ import annotations

import threading
from array import array

import numpy as np

from .byte_items import cells
from .format import BATCH_HEADER, CRC_START, crc32c

_CRC_TABLES: tuple[np.ndarray, np.ndarray, int] | None = None


def _crc_tables() -> tuple[np.ndarray, np.ndarray, int]:
    """Tables of CRC-32C's linearity for 40-byte messages (a batch header's CRC part).

    ``crc32c(m, c) == ~(zero[~c] ^ part[m])`` where ``zero[x]`` is the register after 40
    zero bytes from register ``x`` and ``part[m]`` the register after ``m`` from 0; both
    are linear over GF(2), so each is a XOR of per-byte table entries (4 for ``zero``, one
    per byte position for ``part``). Built once from ``crc32c`` itself.
    """
    global _CRC_TABLES
    if _CRC_TABLES is None:
        size = BATCH_HEADER.size - CRC_START
        ones = 0xFFFFFFFF
        zeros = bytes(size)
        zero = np.array(
            [[crc32c(zeros, (v << (8 * j)) ^ ones) ^ ones for v in range(256)] for j in range(4)],
            dtype=np.uint32,
        )
        part = np.zeros((size, 256), dtype=np.uint32)
        message = bytearray(size)
        for i in range(size):
            for v in range(256):
                message[i] = v
                part[i, v] = crc32c(bytes(message), ones) ^ ones
            message[i] = 0
        _CRC_TABLES = (zero, part, ones)
    return _CRC_TABLES


def continue_crc(crcs: np.ndarray, messages: np.ndarray) -> np.ndarray:
    """``crc32c(messages[i], crcs[i])`` for every row of an (n, 40) uint8 array at once.

    Rows of one run differ in few byte positions (offsets, timestamps): the first row's
    CRC part is computed once and the others are corrected only where they differ."""
    zero, part, ones = _crc_tables()
    registers = crcs ^ np.uint32(ones)
    shifted = (
        zero[0][registers & 0xFF]
        ^ zero[1][(registers >> 8) & 0xFF]
        ^ zero[2][(registers >> 16) & 0xFF]
        ^ zero[3][registers >> 24]
    )
    first = messages[0]
    constant = crc32c(first.tobytes(), ones) ^ ones
    width = messages.shape[1]
    if width % 8 == 0 and messages.strides[1] == 1 and messages.strides[0] % 8 == 0:
        # the varying byte positions found 8 at a time: the OR of every row's XOR with the
        # first row, as words, has a nonzero byte exactly where some row differs (a column
        # at a time: numpy reduces a narrow 2-D array over its rows slowly)
        words = messages.view("<u8")
        varying = []
        for j in range(width // 8):
            column = words[:, j]
            folded = int(np.bitwise_or.reduce(column ^ column[0]))
            varying += [8 * j + b for b in range(8) if (folded >> (8 * b)) & 0xFF]
    else:
        varying = np.flatnonzero((messages != first).any(axis=0)).tolist()
    acc = np.full(len(messages), 0, dtype=np.uint32)
    for i in varying:
        acc ^= part[i][messages[:, i]]
        constant ^= int(part[i][first[i]])
    return (shifted ^ acc) ^ np.uint32(constant ^ ones)


_ROWS_CRC_MAX_LENGTH = 4096  # longer batches: one crc32c call each (tables would be large)
_ROWS_CRC_MAX_VARYING = 40  # a table lookup per varying byte costs ~1/40 of a crc32c call
_SHIFT_ROWS: dict[int, np.ndarray] = {}


def _shift_row(distance: int) -> np.ndarray:
    """``row[v]``: the CRC-32C register (started at 0, no final inversion) after the byte
    ``v`` followed by ``distance`` zero bytes. Built from ``crc32c`` itself, bit by bit
    (the register is linear in ``v``), and kept."""
    row = _SHIFT_ROWS.get(distance)
    if row is None:
        ones = 0xFFFFFFFF
        zeros = bytes(distance)
        bits = [crc32c(bytes((1 << b,)) + zeros, ones) ^ ones for b in range(8)]
        values = np.arange(256)
        row = np.zeros(256, dtype=np.uint32)
        for b, contribution in enumerate(bits):
            row[(values >> b) & 1 == 1] ^= np.uint32(contribution)
        _SHIFT_ROWS[distance] = row
    return row


def rows_crcs(rows: np.ndarray) -> np.ndarray:
    """The CRC of every stored batch of an ``(n, length)`` uint8 array whose rows are
    whole batches of one length, each computed exactly as :func:`check_batch` does
    (``crc32c`` of the body continued over header bytes [8, 48)), for the caller to
    compare with the CRC fields in one vector comparison.

    Two ways, the same values: by table (:func:`_rows_crcs_by_table`) where few byte
    columns vary, else one ``crc32c`` call per row over its message (body, then header
    bytes [8, 48)), the messages gathered a block at a time into a scratch buffer whose
    rows are ready-made memoryviews (:func:`_messages_crcs`).
    """
    crcs = _rows_crcs_by_table(rows)
    if crcs is not None:
        return crcs
    return _messages_crcs(rows)


_CRC_SCRATCH_BYTES = 256 << 10  # a block of messages: stays in a core's L2 cache
_CRC_SCRATCH_LENGTHS = 4  # message lengths whose views a thread keeps at once


class _CrcScratch(threading.local):
    """One thread's scratch buffer for :func:`_messages_crcs`, and per message length the
    buffer cut into memoryviews of that length. ``busy`` guards against a re-entrant call
    (a signal handler that reads a log), which then takes the path without scratch."""

    def __init__(self) -> None:
        self.buffer = bytearray(_CRC_SCRATCH_BYTES)
        self.views: dict[int, tuple[np.ndarray, list[memoryview]]] = {}
        self.busy = False

    def block(self, size: int) -> tuple[np.ndarray, list[memoryview]]:
        """The buffer as an ``(rows, size)`` array and its rows as memoryviews."""
        found = self.views.get(size)
        if found is None:
            if len(self.views) >= _CRC_SCRATCH_LENGTHS:
                self.views.clear()
            rows = _CRC_SCRATCH_BYTES // size
            view = memoryview(self.buffer)
            found = self.views[size] = (
                np.frombuffer(self.buffer, dtype=np.uint8, count=rows * size).reshape(rows, size),
                [view[i : i + size] for i in range(0, rows * size, size)],
            )
        return found


_crc_scratch = _CrcScratch()


assert array("I").itemsize == 4  # read back as uint32


def _messages_crcs(rows: np.ndarray) -> np.ndarray:
    """:func:`rows_crcs` by one ``crc32c`` call per row (any row contents).

    Why a scratch buffer cut into memoryviews: each row's message must be contiguous
    (its header part follows its body), so it is copied anyway; copied into the same
    scratch block after block, the messages are read by ``crc32c`` through views made
    once per thread, where a ``bytes`` item per row (``tolist``) cost a fresh object
    each, and fresh memory (page faults) wherever the allocator had handed its pages back.
    The CRCs come back through an ``array`` (its conversion of ``int`` objects costs less
    than ``numpy.fromiter``'s).
    """
    n, length = rows.shape
    header_size = BATCH_HEADER.size
    body = length - header_size
    size = length - CRC_START
    scratch = _crc_scratch
    if scratch.busy or size > _CRC_SCRATCH_BYTES // 2:
        messages = np.empty((n, size), dtype=np.uint8)
        messages[:, :body] = rows[:, header_size:]
        messages[:, body:] = rows[:, CRC_START:header_size]
        items = messages.view(f"V{size}").ravel().tolist()
        return np.fromiter(map(crc32c, items), dtype=np.uint32, count=n)
    scratch.busy = True
    try:
        block, views = scratch.block(size)
        per = len(views)
        crcs = np.empty(n, dtype=np.uint32)
        # (an empty body has no cells to copy)
        copies = [(cells(rows[:, CRC_START:header_size]), cells(block[:, body:]))]
        if body:
            copies.append((cells(rows[:, header_size:]), cells(block[:, :body])))
        for start in range(0, n, per):
            stop = min(n, start + per)
            for source, target in copies:
                target[: stop - start] = source[start:stop]
            items = views if stop - start == per else views[: stop - start]
            crcs[start:stop] = np.frombuffer(array("I", map(crc32c, items)), dtype=np.uint32)
        return crcs
    finally:
        scratch.busy = False


def _rows_crcs_by_table(rows: np.ndarray) -> np.ndarray | None:
    """:func:`rows_crcs` by table lookups, or ``None`` when that would not be faster
    (rows too long, or too many byte columns vary).

    Why it is exact and fast: the CRC is affine over GF(2), so for two messages ``a`` and
    ``b`` of one length ``crc(a) ^ crc(b)`` is the XOR, over the byte positions ``i``
    where they differ, of a table entry for ``(a[i] ^ b[i], distance of i to the end)``.
    Single appends of records of one size differ in few byte positions (offsets,
    timestamps, part of the key): the first row's CRC is one ``crc32c`` call and every
    other row's is the first's corrected by one vectorised table lookup per varying
    column. Each row's own bytes enter its own CRC; nothing is combined across rows.
    """
    n, length = rows.shape
    if length > _ROWS_CRC_MAX_LENGTH or length <= BATCH_HEADER.size or n < 2:
        return None
    header_size = BATCH_HEADER.size
    probe = min(n, 16)
    if _varying_columns(rows[:probe]).size > _ROWS_CRC_MAX_VARYING:
        return None  # varied records (random values): not worth the full comparison
    varying = _varying_columns(rows)
    varying = varying[varying >= CRC_START]  # the length and CRC fields are not covered
    if varying.size > _ROWS_CRC_MAX_VARYING:
        return None
    first = rows[0]
    crc = crc32c(first[CRC_START:header_size].tobytes(), crc32c(first[header_size:].tobytes()))
    # the message is body (file columns [48, length)) then header bytes [8, 48): the
    # distance of a file column to the message's last byte
    message_last = length - CRC_START - 1
    body = varying >= header_size
    index = np.where(body, varying - header_size, varying - CRC_START + length - header_size)
    acc = np.zeros(n, dtype=np.uint32)
    for column, distance in zip(varying.tolist(), (message_last - index).tolist(), strict=True):
        acc ^= _shift_row(distance)[rows[:, column]]
    return acc ^ np.uint32(int(acc[0]) ^ crc)


def _varying_columns(rows: np.ndarray) -> np.ndarray:
    """Column indexes where some row differs from the row before it (every column that
    is not constant), compared a word at a time where the row length allows."""
    length = rows.shape[1]
    for width in (8, 4, 2):
        if length % width == 0 and rows.flags.c_contiguous:
            words = rows.view(f"<u{width}")
            wide = np.flatnonzero((words[1:] != words[:-1]).any(axis=0))
            return (wide[:, None] * width + np.arange(width)).ravel()
    return np.flatnonzero((rows[1:] != rows[:-1]).any(axis=0))
