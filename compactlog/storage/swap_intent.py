"""The swap intent ``cleaner.swap``: which segments a compaction swap replaces.

Written by ``swap.replace_segments`` (its step 2) and removed by its step 5; read here only,
by the swap's recovery and by the segment chain's check (a swap under way may leave the
rewrite linking past segments it is about to remove: ``segment_chain.py``).
"""

from __future__ import annotations

import json
import os

from .filenames import SWAP_INTENT


def read_intent(directory: str) -> tuple[int, list[int]] | None:
    """The first segment and the others of a swap under way or interrupted, or ``None``."""
    try:
        with open(os.path.join(directory, SWAP_INTENT), "rb") as handle:
            intent = json.loads(handle.read())
    except FileNotFoundError:
        return None
    return int(intent["first"]), [int(b) for b in intent["others"]]


__all__ = ["read_intent"]
