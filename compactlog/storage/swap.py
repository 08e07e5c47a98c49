"""Replacing a group of segments by its cleaned rewrite (workq's ``.rw`` + Kafka's swap).

Crash protocol of :func:`replace_segments` (caller holds the cleaner lock; the rewrite
``<first>.log.rw`` and ``<first>.idx.rw`` are complete):

0. Give the ``.log.rw`` the link of the group's last segment (``segment_chain.py``): it
   names the segment after the group. Death here: the ``.rw`` files are never trusted.
1. fsync both ``.rw`` files, then the directory, so that their entries are on disk before
   the intent that relies on them (a file system that reorders metadata, btrfs-like, could
   otherwise keep the intent and lose the ``.log.rw``, and recovery would complete a swap
   whose new segment is gone). Death here: recovery removes them (old state).
2. Write the intent file ``cleaner.swap`` (atomic) naming the first segment and the ones the
   group replaces. Death here: ``.rw`` files still exist, so recovery rolls back: removes
   them and the intent (old state), and rebuilds the first segment's index.
3. Rename ``.idx.rw`` over the index, then ``.log.rw`` over the segment (atomic each).
   Death between the two renames: the ``.log.rw`` still exists, so recovery rolls back as
   in 2 (the index is rebuilt from the old segment).
4. fsync the directory (the renames reach the disk before any removal: otherwise a power
   loss could keep the removals and lose the rename, and with it the records the removed
   segments held), then remove the other segments of the group with their indexes. Death
   here: the ``.log.rw`` is gone, so recovery completes the swap: removes what the intent
   names (new state).
5. fsync the directory, then remove the intent.

Readers are never confused in between: they follow offsets, and every record a removed
segment held that survives cleaning is already in the renamed first segment.
"""

from __future__ import annotations

import json
import os

from ..config import LogConfig
from ..errors import CompactLogError
from . import filenames, segment_chain
from .filenames import SWAP_INTENT
from .fsio import FileSystem
from .segment import index_path, segment_path
from .state_files import read_meta
from .swap_intent import read_intent
from .tail import rebuild_index


def replace_segments(fs: FileSystem, directory: str, first: int, others: list[int]) -> None:
    log_rw = filenames.rewrite_name(segment_path(directory, first))
    idx_rw = filenames.rewrite_name(index_path(directory, first))
    # 0.
    last = others[-1] if others else first
    header = segment_chain.read_header(directory, last)
    following = None if header is None else segment_chain.next_base(header, last)
    fd = fs.open(log_rw, os.O_RDWR)
    try:
        segment_chain.stamp(fs, fd, first, following)
    finally:
        fs.close(fd)
    # 1.
    for path in (log_rw, idx_rw):
        fd = fs.open(path, os.O_RDONLY)
        try:
            fs.fsync(fd)
        finally:
            fs.close(fd)
    fs.fsync_dir(directory)
    # 2.
    fs.write_atomic(directory, SWAP_INTENT, json.dumps({"first": first, "others": others}).encode())
    # 3.
    fs.rename(idx_rw, index_path(directory, first))
    fs.rename(log_rw, segment_path(directory, first))
    # 4.
    fs.fsync_dir(directory)
    _remove_segments(fs, directory, others)
    # 5.
    fs.fsync_dir(directory)
    fs.remove(os.path.join(directory, SWAP_INTENT))


def _remove_segments(fs: FileSystem, directory: str, bases: list[int]) -> None:
    for base in bases:
        # the index first: a death in between leaves a segment without an index (rebuilt
        # on open), never an index without its segment
        for path in (index_path(directory, base), segment_path(directory, base)):
            try:
                fs.remove(path)
            except FileNotFoundError:
                continue


def resolve_interrupted_swap(fs: FileSystem, directory: str) -> list[str]:
    """Finish or undo a swap that a dead (or failed) cleaner left (caller holds the cleaner
    lock).

    The ``.log.rw`` decides: present, the swap had not passed step 3 and is undone; gone,
    it had and is completed. So an undo must keep the ``.log.rw`` as long as the intent
    exists (were the ``.log.rw`` gone first, a death or failure before the intent's removal
    would make the next resolve *complete* the swap and remove segments whose records the
    old first segment does not hold). The undo, in order:

    1. rebuild the first segment's index from the old segment (step 3 may have renamed the
       new index over it). Death or failure here: nothing else changed, undo again.
    2. remove the intent and fsync the directory. Death here: no intent, the ``.rw`` files
       are strays, removed by the next open or pass.
    3. remove the ``.rw`` files and fsync the directory.
    """
    intent_path = os.path.join(directory, SWAP_INTENT)
    intent = read_intent(directory)
    if intent is None:
        return []
    first, others = intent
    log_rw = filenames.rewrite_name(segment_path(directory, first))
    if os.path.exists(log_rw):
        # 1. (at the log's own index interval, as the writer and the cleaner index)
        try:
            interval = read_meta(directory).config.index_interval_bytes
        except CompactLogError:
            interval = LogConfig().index_interval_bytes  # (repair of a damaged meta)
        rebuild_index(fs, directory, first, interval)
        # 2.
        fs.remove(intent_path)
        fs.fsync_dir(directory)
        # 3.
        for path in (log_rw, filenames.rewrite_name(index_path(directory, first))):
            try:
                fs.remove(path)
            except FileNotFoundError:
                pass
        fs.fsync_dir(directory)
        return [f"rolled back an interrupted clean of segment {filenames.segment_name(first)}"]
    # every one of them: a death between removing a segment and its index left an orphan
    # index, which must go too
    _remove_segments(fs, directory, others)
    fs.fsync_dir(directory)
    fs.remove(intent_path)
    return [
        f"completed an interrupted clean of segment {filenames.segment_name(first)} "
        f"(removed {len(others)} replaced segments)"
    ]
