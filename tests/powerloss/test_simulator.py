"""The simulator itself: what the recorder sees and what each crash model allows, on small
scripted file operations (no log involved), so a wrong model cannot pass the suite."""

from __future__ import annotations

import mmap
import os
import sys
import types
from collections.abc import Callable

import pytest

from .models import SECTOR, CrashState, garbled, ordered, reordered, strict
from .recorder import Recorder, Recording


def _record(root: str, script: Callable[[str], None], setup: Callable[[str], None] | None = None):
    if setup is not None:
        setup(root)
    recorder = Recorder(root)
    with recorder.recording():
        script(root)
    return recorder.result()


def _files(state: CrashState) -> dict[str, bytes]:
    return dict(state.files)


def _write_new(root: str, name: str, data: bytes, *, sync: bool) -> None:
    fd = os.open(os.path.join(root, name), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, data)
    if sync:
        os.fsync(fd)
    os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)


def _last(states_by_event: list[list[CrashState]]) -> list[CrashState]:
    return states_by_event[-1]


def test_every_changing_call_is_an_event_and_reads_are_not(tmp_path):
    def script(root: str) -> None:
        _write_new(root, "a", b"x", sync=True)
        with open(os.path.join(root, "a"), "rb") as handle:  # a read: no event
            handle.read()
        os.rename(os.path.join(root, "a"), os.path.join(root, "b"))
        os.unlink(os.path.join(root, "b"))

    recording = _record(str(tmp_path), script)
    assert [e.call for e in recording.events] == ["open", "write", "fsync", "rename", "unlink"]
    assert recording.events[1].tree.files() == {"a": b"x"}
    assert recording.events[-1].tree.files() == {}


def test_calls_outside_the_root_are_not_events(tmp_path):
    (tmp_path / "root").mkdir()
    recording = _record(
        str(tmp_path / "root"), lambda root: _write_new(str(tmp_path), "outside", b"x", sync=True)
    )
    assert recording.events == []


def test_a_from_os_import_binding_in_the_library_is_recorded(tmp_path):
    from compactlog.engine import single

    def script(root: str) -> None:
        fd = os.open(os.path.join(root, "a"), os.O_RDWR | os.O_CREAT)
        single.pwrite(fd, b"abc", 0)
        os.close(fd)

    recording = _record(str(tmp_path), script)
    assert [e.call for e in recording.events] == ["open", "pwrite"]


def test_a_library_module_first_imported_during_a_recording_is_recorded_by_the_next(
    tmp_path, monkeypatch
):
    real_pwrite = os.pwrite
    module = types.ModuleType("compactlog._imported_while_recording")

    def script(root: str) -> None:
        module.pwrite = os.pwrite  # what `from os import pwrite` binds during a recording
        monkeypatch.setitem(sys.modules, module.__name__, module)
        fd = os.open(os.path.join(root, "a"), os.O_RDWR | os.O_CREAT)
        module.pwrite(fd, b"abc", 0)
        os.close(fd)

    first = _record(str(tmp_path), script)
    assert module.pwrite is real_pwrite  # no recorder's wrapper left behind

    def again(root: str) -> None:
        fd = os.open(os.path.join(root, "a"), os.O_RDWR)
        module.pwrite(fd, b"def", 0)
        os.close(fd)

    second = _record(str(tmp_path), again)
    assert [e.call for e in first.events] == ["open", "pwrite"]
    assert [e.call for e in second.events] == ["pwrite"]


def test_stores_into_a_shared_map_show_at_the_next_event_and_msync_syncs(tmp_path):
    def setup(root: str) -> None:
        _write_new(root, "m", bytes(SECTOR), sync=True)

    def script(root: str) -> None:
        fd = os.open(os.path.join(root, "m"), os.O_RDWR)
        mapped = mmap.mmap(fd, SECTOR)
        mapped[0:5] = b"hello"  # no system call
        mapped.flush()
        mapped.close()
        os.close(fd)

    recording = _record(str(tmp_path), script, setup)
    assert [e.call for e in recording.events] == ["msync"]
    assert _files(_last(list(strict(recording)))[0])["m"].startswith(b"hello")


def test_a_node_keeps_its_identity_across_a_rename(tmp_path):
    def script(root: str) -> None:
        fd = os.open(os.path.join(root, "a"), os.O_WRONLY | os.O_CREAT)
        os.rename(os.path.join(root, "a"), os.path.join(root, "b"))
        _fsync_dir(root)
        os.write(fd, b"data")
        os.fsync(fd)  # the fsync of "a"'s descriptor makes "b"'s content durable
        os.close(fd)

    recording = _record(str(tmp_path), script)
    assert _files(_last(list(strict(recording)))[0]) == {"b": b"data"}


# -- strict ----------------------------------------------------------------------------
def test_strict_a_new_file_needs_its_directory_fsynced(tmp_path):
    def script(root: str) -> None:
        _write_new(root, "a", b"data", sync=True)
        _fsync_dir(root)

    states = list(strict(_record(str(tmp_path), script)))
    assert _files(states[2][0]) == {}  # after the file's fsync
    assert _files(states[3][0]) == {"a": b"data"}  # after the directory's


def test_strict_unsynced_data_is_lost_and_an_fsync_keeps_it(tmp_path):
    def setup(root: str) -> None:
        _write_new(root, "a", b"old", sync=True)

    def script(root: str) -> None:
        fd = os.open(os.path.join(root, "a"), os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"+new")
        os.fdatasync(fd)
        os.close(fd)

    states = list(strict(_record(str(tmp_path), script, setup)))
    assert [_files(s[0])["a"] for s in states] == [b"old", b"old+new"]


def test_strict_a_rename_or_unlink_without_a_directory_fsync_did_not_happen(tmp_path):
    def setup(root: str) -> None:
        _write_new(root, "a", b"1", sync=True)
        _write_new(root, "gone", b"2", sync=True)
        _fsync_dir(root)

    def script(root: str) -> None:
        os.replace(os.path.join(root, "a"), os.path.join(root, "b"))
        os.unlink(os.path.join(root, "gone"))
        _fsync_dir(root)

    states = list(strict(_record(str(tmp_path), script, setup)))
    assert _files(states[1][0]) == {"a": b"1", "gone": b"2"}
    assert _files(states[-1][0]) == {"b": b"1"}


def test_strict_a_new_directory_needs_its_parent_fsynced(tmp_path):
    def script(root: str) -> None:
        os.makedirs(os.path.join(root, "d", "e"))
        _write_new(os.path.join(root, "d", "e"), "f", b"x", sync=True)
        _fsync_dir(os.path.join(root, "d", "e"))
        _fsync_dir(os.path.join(root, "d"))
        _fsync_dir(root)

    states = list(strict(_record(str(tmp_path), script)))
    assert [s[0].dirs for s in states[-3:]] == [(), (), ("d", "d/e")]
    assert _files(states[-1][0]) == {"d/e/f": b"x"}


# -- ordered ---------------------------------------------------------------------------
def test_ordered_metadata_reaches_disk_in_order(tmp_path):
    def script(root: str) -> None:
        _write_new(root, "a", b"", sync=False)
        _write_new(root, "b", b"", sync=False)

    states = list(ordered(_record(str(tmp_path), script)))
    names = {tuple(sorted(_files(s))) for s in _last(states)}
    assert names == {(), ("a",), ("a", "b")}  # never b without a


def test_ordered_a_sync_commits_every_earlier_metadata_call(tmp_path):
    def setup(root: str) -> None:
        _write_new(root, "other", b"", sync=True)

    def script(root: str) -> None:
        _write_new(root, "a", b"", sync=False)
        fd = os.open(os.path.join(root, "other"), os.O_WRONLY)
        os.fsync(fd)
        os.close(fd)

    states = list(ordered(_record(str(tmp_path), script, setup)))
    assert all("a" in _files(s) for s in _last(states))


def test_ordered_unsynced_sectors_are_each_old_or_new(tmp_path):
    old, new = b"o" * SECTOR * 3, b"n" * SECTOR * 3

    def setup(root: str) -> None:
        _write_new(root, "a", old, sync=True)

    def script(root: str) -> None:
        fd = os.open(os.path.join(root, "a"), os.O_WRONLY)
        for sector in (2, 0, 1):  # write order: 2, 0, 1
            os.pwrite(fd, new[:SECTOR], sector * SECTOR)
        os.close(fd)

    found = {_files(s)["a"] for s in _last(list(ordered(_record(str(tmp_path), script, setup))))}
    chunks = [{data[i * SECTOR : (i + 1) * SECTOR] for data in found} for i in range(3)]
    assert all(chunk <= {b"o" * SECTOR, b"n" * SECTOR} for chunk in chunks)
    assert {
        old,
        new,
        old[: 2 * SECTOR] + new[:SECTOR],
        b"n" * SECTOR + b"o" * SECTOR + b"n" * SECTOR,
    } <= found


def test_ordered_a_size_change_is_metadata_and_an_extension_may_read_zeros(tmp_path):
    def setup(root: str) -> None:
        _write_new(root, "a", b"abc", sync=True)

    def script(root: str) -> None:
        fd = os.open(os.path.join(root, "a"), os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"d" * SECTOR)
        os.close(fd)

    found = {_files(s)["a"] for s in _last(list(ordered(_record(str(tmp_path), script, setup))))}
    head, tail = b"abc" + b"d" * (SECTOR - 3), b"ddd"
    zeros = bytes(SECTOR)
    allowed = {b"abc", head + tail, b"abc" + zeros, head + zeros[:3], b"abc" + zeros[3:] + tail}
    assert {b"abc", head + tail, b"abc" + zeros} <= found <= allowed


# -- slow models -----------------------------------------------------------------------
@pytest.mark.slow
def test_reordered_metadata_may_reach_disk_out_of_order(tmp_path):
    def script(root: str) -> None:
        _write_new(root, "a", b"", sync=False)
        _write_new(root, "b", b"", sync=False)

    names = {
        tuple(sorted(_files(s))) for s in _last(list(reordered(_record(str(tmp_path), script))))
    }
    assert ("b",) in names


@pytest.mark.slow
def test_garbled_sectors_are_neither_old_nor_new(tmp_path):
    def setup(root: str) -> None:
        _write_new(root, "a", b"o" * SECTOR, sync=True)

    def script(root: str) -> None:
        fd = os.open(os.path.join(root, "a"), os.O_WRONLY)
        os.pwrite(fd, b"n" * SECTOR, 0)
        os.close(fd)

    found = {_files(s)["a"] for s in _last(list(garbled(_record(str(tmp_path), script, setup))))}
    assert found - {b"o" * SECTOR, b"n" * SECTOR}


def test_a_recording_says_what_was_promised_at_each_crash_point(tmp_path):
    recorder = Recorder(str(tmp_path))
    with recorder.recording():
        recorder.progress = "before"
        _write_new(str(tmp_path), "a", b"x", sync=False)  # events 0 (open) and 1 (write)
        recorder.progress = "after"
    recording: Recording = recorder.result()
    assert [recording.progress_at_crash(i) for i in range(2)] == ["before", "after"]


def test_files_the_library_writes_through_the_builtin_open_are_recorded(tmp_path):
    from compactlog.engine import recovery  # (repair rewrites a torn segment header this way)

    def script(root: str) -> None:
        with recovery.open(os.path.join(root, "a"), "wb") as handle:  # type: ignore[attr-defined]
            handle.write(b"abcdef")
            handle.truncate(3)

    recording = _record(str(tmp_path), script)
    assert [e.call for e in recording.events] == ["open", "write", "ftruncate"]
    assert recording.events[-1].tree.files() == {"a": b"abc"}
    assert "open" not in recovery.__dict__  # the built-in again
