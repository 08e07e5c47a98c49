"""Cutting a buffer into many items in C, without a Python object or slice per item.

:func:`struct_layout` builds a ``struct`` format whose one ``unpack_from`` cuts a buffer
into ``bytes`` of lengths that vary; :func:`items_at` gathers fixed-width windows at many
positions as opaque numpy items; :func:`cells` views the rows of a 2-D array as such
items. The decoders and the small-run scanner use them.
"""

from __future__ import annotations

import struct

import numpy as np

_DIGITS: dict[int, np.ndarray] = {}
_TABLE_WIDTH = 4  # counts below 10**4 are written by one table lookup each


def _digits(values: np.ndarray) -> np.ndarray:
    """``values`` (>= 0) as rows of fixed-width zero-padded ASCII decimal digits."""
    width = len(str(int(values.max())))
    if width <= _TABLE_WIDTH:
        table = _DIGITS.get(width)
        if table is None:
            text = "".join(f"{v:0{width}d}" for v in range(10**width)).encode()
            table = _DIGITS[width] = np.frombuffer(text, dtype=np.uint8).reshape(-1, width)
        return table[values]
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.uint64)
    return (values.astype(np.uint64)[:, None] // powers % np.uint64(10) + np.uint64(48)).astype(
        np.uint8
    )


def struct_layout(*columns: tuple[np.ndarray | bytes, bytes], count: int) -> struct.Struct:
    """A ``struct`` layout of ``count`` consecutive items, item ``i`` made of, for each
    column in turn, ``counts[i]`` repetitions of the column's format code (``x`` skips
    bytes, ``s`` takes them as one ``bytes`` object); a column whose counts are ``bytes``
    has that one (decimal) count for every item.

    Why: one ``unpack_from`` with this layout cuts a buffer into ``bytes`` objects of
    lengths that vary, in C, at a fraction of the cost of a slice object and a
    ``__getitem__`` call per piece. The format is written by numpy as fixed-width
    zero-padded decimal counts (``struct`` reads ``048x`` as ``48x``), not formatted
    number by number. Every count must be >= 0."""
    if not count:
        return struct.Struct(b"")
    parts = []
    for counts, code in columns:
        if isinstance(counts, bytes):
            text = np.frombuffer(counts + code, dtype=np.uint8)
            parts.append(np.broadcast_to(text, (count, len(text))))
        else:
            parts.append(_digits(counts))
            parts.append(np.full((count, 1), code[0], dtype=np.uint8))
    return struct.Struct(np.hstack(parts).tobytes())


def items_at(raw: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """``raw[start : start + width]`` for every start, as one opaque (``V``) item each
    (a copy at memcpy speed, where a 2-D gather copies a byte at a time)."""
    windows = np.ndarray((len(raw) - width + 1,), f"V{width}", raw, 0, (1,))
    return windows[starts]


def cells(columns: np.ndarray) -> np.ndarray:
    """The rows of a 2-D uint8 array whose rows are contiguous, as one opaque (``V``)
    item each, without a copy: numpy copies such items a row at a time, where it copies
    the bytes of a 2-D slice one column step at a time (2-5 times slower for rows of
    16-124 bytes). Rows must not be empty."""
    return columns.view(f"V{columns.shape[1]}")[:, 0]
