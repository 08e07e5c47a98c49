"""The newest segment's tail (``tail.py``) behind its narrow interface, and the writer's
boundaries (issue 20): no other module reaches into ``SegmentWriter``'s private members."""

from __future__ import annotations

import ast
import os
import pathlib

import pytest

import compactlog
from compactlog.encoding.format import INDEX_ENTRY
from compactlog.storage import filenames
from compactlog.storage.fsio import DEFAULT_FS
from compactlog.storage.head import read_head_file
from compactlog.storage.segment import HEADER_SIZE, index_path, read_index
from compactlog.storage.tail import batch_at, open_newest_tail, rebuild_index

from .helpers import append_bytes, batch_positions

PACKAGE = pathlib.Path(compactlog.__file__).parent


def _tail(log_dir, head, **kwargs):
    return open_newest_tail(
        str(log_dir),
        DEFAULT_FS,
        head,
        log_start=0,
        index_interval=1,
        sync_new_file=DEFAULT_FS.fdatasync,
        **kwargs,
    )


def _close(tail) -> None:
    os.close(tail.fd)
    os.close(tail.index_fd)


def test_the_tail_answers_where_the_data_ends_and_cuts_a_torn_batch(log_dir):
    with compactlog.open(log_dir, index_interval_bytes=1) as log:
        for i in range(3):
            log.append(b"k%d" % i, b"v")
    segment = log_dir / filenames.segment_name(0)
    size = segment.stat().st_size
    append_bytes(segment, b"\x99" * 30)  # a torn batch past what the head vouches for
    head = read_head_file(str(log_dir / filenames.WRITER_LOCK))
    tail = _tail(log_dir, head)
    try:
        assert (tail.base, tail.size, tail.next_offset) == (0, size, 3)
        assert tail.cuts == [(str(segment), size, 30)]
        assert not tail.rebuilt_index
        assert tail.last_index_pos == batch_positions(segment)[-1][0]
    finally:
        _close(tail)
    assert segment.stat().st_size == size


@pytest.mark.leaves_damage  # the stale index entry is the point (readers check each entry)
def test_a_stale_index_hint_falls_back_to_the_segment_start(log_dir):
    with compactlog.open(log_dir, index_interval_bytes=1) as log:
        for i in range(3):
            log.append(b"k%d" % i, b"v")
    segment = log_dir / filenames.segment_name(0)
    second = batch_positions(segment)[1][0]  # the batch holding offset 1
    fd = os.open(segment, os.O_RDONLY)
    try:
        assert batch_at(fd, HEADER_SIZE).base_offset == 0
        assert batch_at(fd, second).base_offset == 1
        assert batch_at(fd, second + 1) is None
    finally:
        os.close(fd)
    rebuild_index(DEFAULT_FS, str(log_dir), 0, 1 << 20)
    assert len(read_index(str(log_dir), 0)) == 1
    with open(index_path(str(log_dir), 0), "ab") as handle:
        handle.write(INDEX_ENTRY.pack(2, second))  # names offset 2 where offset 1 starts
    tail = _tail(log_dir, None, trust_head=False)
    try:
        assert (tail.size, tail.next_offset, tail.cuts) == (segment.stat().st_size, 3, [])
    finally:
        _close(tail)


def test_no_module_reaches_into_the_writers_private_members():
    """``single.py`` binds ``SegmentWriter.fast_path_hooks()``; recovery calls public
    methods. A ``writer._name`` (or ``log.writer._name``) outside writer.py is a leak."""
    leaks = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "writer.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
                continue
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if name == "writer" and not node.attr.startswith("__"):
                leaks.append(f"{path.relative_to(PACKAGE)}:{node.lineno} writer.{node.attr}")
    assert leaks == []


def test_after_a_crash_an_index_entry_naming_a_replaced_batch_is_rebuilt(log_dir):
    """An index grows without fsync, so a power loss can leave an entry of a batch that was
    lost and replaced by a batch of another size: the entry still looks consistent (inside
    the data, increasing) but points into the middle of a batch. Recovery checks each entry
    of the newest segment's index after an unclean shutdown and rebuilds it."""
    with compactlog.open(log_dir, index_interval_bytes=1) as log:
        for i in range(4):
            log.append(b"k%d" % i, b"v" * (10 + i))
    segment = log_dir / filenames.segment_name(0)
    positions = [position for position, _ in batch_positions(segment)]
    entries = read_index(str(log_dir), 0)
    assert len(entries) >= 2
    wrong = entries.copy()
    wrong[-2, 1] = positions[-2] + 1  # inside the data, still increasing, but mid-batch
    with open(index_path(str(log_dir), 0), "r+b") as handle:
        handle.seek(HEADER_SIZE)
        handle.write(wrong.astype("<u4").tobytes())
    tail = _tail(log_dir, None, trust_head=False, cut_from=0)  # as recovery calls it
    try:
        assert tail.rebuilt_index
        assert (read_index(str(log_dir), 0)[:, 1] != positions[-2] + 1).all()
    finally:
        _close(tail)
    with compactlog.open(log_dir) as log:
        log.check()
        assert [r.value for r in log.read()] == [b"v" * (10 + i) for i in range(4)]
