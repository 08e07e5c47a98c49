"""The segment chain (storage/segment_chain.py): a log knows its own segment files.

Each closed segment's file header names the next segment's base. A segment deleted by hand
(with or without its index) or one copied in from another log is found by every open and
by ``verify``, through compaction's grouped rewrites and retention's removals, which keep
the chain whole; ``repair`` accepts a loss by relinking over it.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.engine.invariants import verify_log
from compactlog.errors import MissingSegmentError
from compactlog.storage import filenames, segment_chain
from compactlog.storage.segment import list_segments


def make_log(path: Path, *, records: int = 400, segment_bytes: int = 2048) -> list[int]:
    with compactlog.open(path, segment_bytes=segment_bytes, sync="os") as log:
        for i in range(records):
            log.append(f"k{i % 40}".encode(), b"v%d" % i * 4)
    return list_segments(str(path))


def remove_segment(path: Path, base: int, *, with_index: bool = True) -> None:
    os.remove(path / filenames.segment_name(base))
    if with_index:
        os.remove(path / filenames.index_name(base))


def offsets(path: Path) -> list[int]:
    with compactlog.open(path, read_only=True) as log:
        return [r.offset for r in log.read()]


def test_every_closed_segment_names_the_next_and_the_newest_names_none(tmp_path):
    bases = make_log(tmp_path / "log")
    headers = [segment_chain.read_header(str(tmp_path / "log"), b) for b in bases]
    assert [segment_chain.next_base(h, b) for h, b in zip(headers, bases, strict=True)] == [
        *bases[1:],
        None,
    ]


@pytest.mark.parametrize("with_index", [True, False], ids=["with_index", "segment_only"])
@pytest.mark.parametrize("read_only", [True, False], ids=["read_only", "writable"])
def test_a_middle_segment_deleted_by_hand_is_named_by_every_open(tmp_path, with_index, read_only):
    path = tmp_path / "log"
    bases = make_log(path)
    remove_segment(path, bases[2], with_index=with_index)
    with pytest.raises(MissingSegmentError, match=filenames.segment_name(bases[2])):
        compactlog.open(path, read_only=read_only)


def test_verify_names_a_middle_segment_deleted_with_its_index_and_the_offsets_lost(tmp_path):
    path = tmp_path / "log"
    bases = make_log(path)
    remove_segment(path, bases[2])
    [problem] = verify_log(str(path)).problems
    assert problem.kind == "missing_segment"
    assert problem.file == filenames.segment_name(bases[2])
    assert f"offsets {bases[2]} to {bases[3] - 1} are lost" in problem.message


def test_the_first_segment_deleted_is_named_by_a_read_only_open(tmp_path):
    path = tmp_path / "log"
    bases = make_log(path)
    remove_segment(path, bases[0])
    with pytest.raises(MissingSegmentError, match=f"offsets 0 to {bases[1] - 1} are missing"):
        compactlog.open(path, read_only=True)


def test_a_segment_of_another_log_is_not_taken_for_one_of_this_log(tmp_path):
    path, other = tmp_path / "log", tmp_path / "other"
    bases = make_log(path, segment_bytes=4096)
    foreign = next(b for b in make_log(other, segment_bytes=2048) if b not in bases and b > 0)
    shutil.copy(other / filenames.segment_name(foreign), path / filenames.segment_name(foreign))
    with pytest.raises(MissingSegmentError, match="is not one of this log's"):
        compactlog.open(path, read_only=True)
    kinds = {(p.kind, p.file) for p in verify_log(str(path)).problems}
    assert ("missing_segment", filenames.segment_name(foreign)) in kinds


def test_repair_moves_a_segment_of_another_log_aside_and_keeps_this_logs_records(tmp_path):
    path, other = tmp_path / "log", tmp_path / "other"
    bases = make_log(path, segment_bytes=4096)
    everything = offsets(path)
    foreign = next(b for b in make_log(other, segment_bytes=2048) if b not in bases and b > 0)
    for name in (filenames.segment_name(foreign), filenames.index_name(foreign)):
        shutil.copy(other / name, path / name)
    report = compactlog.repair(path)
    moved = filenames.quarantine_name(filenames.segment_name(foreign), 0)
    assert [f for f in report.fixes if f.endswith(f"moved it aside to {moved}")], report.fixes
    assert (path / moved).exists()
    assert verify_log(str(path)).ok
    assert offsets(path) == everything


def test_the_chain_stays_whole_through_compaction_and_retention(tmp_path):
    path = tmp_path / "log"
    settings = {"cleanup_policy": "compact,delete", "retention_bytes": 12000}
    with compactlog.open(path, segment_bytes=2048, sync="os", **settings) as log:
        for i in range(600):
            log.append(f"k{i % 10}".encode(), b"v%d" % i * 4)
        before = len(list_segments(str(path)))
        log.compact(force=True)  # merges the small cleaned segments into groups
        assert len(list_segments(str(path))) < before
        for i in range(1500):
            log.append(f"n{i}".encode(), b"v%d" % i * 4)
        log.compact(force=True)  # (and retention, which removes segments from the front)
        log.enforce_retention()
        assert list_segments(str(path))[0] > 0
        log.check()
    assert verify_log(str(path)).ok
    bases = list_segments(str(path))
    assert segment_chain.find_breaks(str(path), bases) == [] and len(bases) >= 3
    remove_segment(path, bases[1])  # and a segment deleted by hand is still found
    with pytest.raises(MissingSegmentError, match=filenames.segment_name(bases[1])):
        compactlog.open(path, read_only=True)


def test_repair_accepts_the_loss_by_relinking_and_keeps_every_other_record(tmp_path):
    path = tmp_path / "log"
    bases = make_log(path)
    everything = offsets(path)
    remove_segment(path, bases[2])
    report = compactlog.repair(path)
    assert any("accepted the loss" in line for line in report.fixes), report.fixes
    assert verify_log(str(path)).ok
    assert offsets(path) == [o for o in everything if not bases[2] <= o < bases[3]]


def test_a_log_written_before_the_chain_opens_and_verifies_as_before(tmp_path):
    path = tmp_path / "log"
    bases = make_log(path)
    for base in bases:  # (headers as older versions wrote them: flags and reserved 0)
        with open(path / filenames.segment_name(base), "r+b") as handle:
            handle.seek(segment_chain.LINK_AT)
            handle.write(bytes(6))
    assert verify_log(str(path)).ok
    assert len(offsets(path)) == 400
    with compactlog.open(path) as log:  # and its next roll starts the chain
        for _ in range(200):
            log.append(b"k", b"v" * 20)
    assert (
        segment_chain.next_base(segment_chain.read_header(str(path), bases[-1]), bases[-1])
        == list_segments(str(path))[len(bases)]
    )


def test_read_only_opens_beside_compaction_and_retention_never_raise_a_false_alarm(tmp_path):
    path = tmp_path / "log"
    settings = {"cleanup_policy": "compact,delete", "retention_bytes": 20000}
    failures: list[BaseException] = []
    stop = threading.Event()

    def open_again_and_again() -> None:
        while not stop.is_set():
            try:
                compactlog.open(path, read_only=True).close()
            except BaseException as error:
                failures.append(error)
                return

    with compactlog.open(path, segment_bytes=1024, sync="os", **settings) as log:
        log.append(b"k", b"v")
        reader = threading.Thread(target=open_again_and_again)
        reader.start()
        try:
            for round_ in range(30):
                for i in range(60):
                    log.append(f"k{i % 7}".encode(), b"v%d" % (round_ * 60 + i) * 5)
                log.compact(force=True)  # swaps groups, then removes from the front
        finally:
            stop.set()
            reader.join()
    assert not failures, failures[0]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(st.sampled_from(["append", "compact", "reopen"]), min_size=3, max_size=12),
    victim=st.floats(min_value=0, max_value=0.999),
)
def test_whatever_the_history_a_deleted_segment_is_found(tmp_path_factory, steps, victim):
    path = tmp_path_factory.mktemp("chain") / "log"
    log = compactlog.open(path, segment_bytes=1024, sync="os", cleanup_policy="compact,delete")
    try:
        for n, step in enumerate(["append", *steps]):
            if step == "append":
                log.append_batch([(f"k{(n * 13 + i) % 17}".encode(), b"x" * 30) for i in range(40)])
            elif step == "compact":
                log.compact(force=True)
            else:
                log.close()
                log = compactlog.open(path)
    finally:
        log.close()
    bases = list_segments(str(path))
    assert verify_log(str(path)).ok
    if len(bases) < 2:
        return
    gone = bases[int(victim * (len(bases) - 1))]  # any segment but the newest
    remove_segment(path, gone, with_index=False)
    with pytest.raises(MissingSegmentError):
        compactlog.open(path, read_only=True)
    assert not verify_log(str(path)).ok
