"""The damage suite: every file kind of a small log, damaged every way, read by every reader.

SQLite's corruption tests flip and cut every page of every file kind; this does the same for
every file a log has (closed and active segments, an index, ``meta``, the lock files, the
clean-shutdown marker, the cleaner checkpoint, a subscriber checkpoint): a byte flipped, a
range zeroed, the file cut in half, the file deleted (and, for segments, the file header
zeroed, and the segment deleted with its index). Each reader then sees either exactly the
data the log held, or an error that names the damaged file; ``verify`` passes only when the
data reads back exactly, and otherwise names the file; ``repair`` (``--rebuild-meta`` for
``meta``) leaves a log that ``verify`` passes and that still holds every batch the damage
did not touch.

The log is closed cleanly before the damage, so nothing in it is a torn tail: every byte is
durable, and the active segment cut or deleted is damage below its durable point (issue 31,
item 2), named by every reader.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from compactlog.cli.main import main

import compactlog
from compactlog.encoding.format import read_batch_header
from compactlog.errors import CompactLogError
from compactlog.storage import filenames
from tests.helpers import SEGMENT_HEADER_SIZE

DAMAGES = ("flip", "zero", "half", "delete")
SEGMENT_DAMAGES = ("zero_header", "delete_with_index")


@dataclass(frozen=True)
class Template:
    path: Path
    records: list[tuple[int, bytes, bytes | None]]
    latest: dict[bytes, bytes]
    kinds: dict[str, str]  # file kind -> file name


def _build(path: Path) -> None:
    log = compactlog.open(path, segment_bytes=4096, sync="os", index_interval_bytes=256)
    for i in range(300):
        log.append(f"k{i % 50}".encode(), f"v{i}".encode() * 3)
    subscriber = log.subscribe("billing")
    subscriber.poll(max_records=100)
    subscriber.commit()
    log.compact(force=True)  # (writes cleaner.checkpoint)
    for i in range(300, 420):
        log.append(f"k{i % 50}".encode(), f"v{i}".encode() * 3)
    log.flush()
    log.close()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    path = tmp_path_factory.mktemp("damage") / "log"
    _build(path)
    with compactlog.open(path, read_only=True) as log:
        records = [(r.offset, r.key, r.value) for r in log.read()]
    latest = {k: v for _o, k, v in records if v is not None}
    segments = sorted(n for n in os.listdir(path) if n.endswith(".log"))
    assert len(segments) >= 3
    names = set(os.listdir(path))
    kinds = {
        "first segment": segments[0],
        "middle segment": segments[1],
        "active segment": segments[-1],
        "index": filenames.index_name(int(segments[1][:-4])),
        "meta": filenames.META,
        "head lock": filenames.WRITER_LOCK,
        "writers lock": filenames.WRITERS_LOCK,
        "cleaner lock": filenames.CLEANER_LOCK,
        "subscriber lock": filenames.subscriber_lock_name("billing"),
        "clean shutdown": filenames.CLEAN_SHUTDOWN,
        "cleaner checkpoint": filenames.CLEANER_CHECKPOINT,
        "subscriber checkpoint": filenames.checkpoint_name("billing"),
    }
    assert set(kinds.values()) <= names, names
    return Template(path, records, latest, kinds)


def _cases() -> list[object]:
    kinds = [
        "first segment",
        "middle segment",
        "active segment",
        "index",
        "meta",
        "head lock",
        "writers lock",
        "cleaner lock",
        "subscriber lock",
        "clean shutdown",
        "cleaner checkpoint",
        "subscriber checkpoint",
    ]
    cases: list[object] = []
    for kind in kinds:
        damages = DAMAGES + (SEGMENT_DAMAGES if kind.endswith("segment") else ())
        for damage in damages:
            cases.append(pytest.param(kind, damage, id=f"{kind.replace(' ', '_')}-{damage}"))
    return cases


def damage(directory: Path, name: str, how: str) -> tuple[int, int]:
    """Damage file ``name`` of ``directory``; returns the byte range ``[a, b)`` damaged."""
    path = directory / name
    size = path.stat().st_size
    if how == "flip":
        if size == 0:
            return 0, 0
        data = bytearray(path.read_bytes())
        data[size // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        return size // 2, size // 2 + 1
    if how == "zero":
        data = bytearray(path.read_bytes())
        start = size // 3
        data[start : start + 16] = bytes(len(data[start : start + 16]))
        path.write_bytes(bytes(data))
        return start, min(size, start + 16)
    if how == "zero_header":
        data = bytearray(path.read_bytes())
        data[:SEGMENT_HEADER_SIZE] = bytes(SEGMENT_HEADER_SIZE)
        path.write_bytes(bytes(data))
        return 0, SEGMENT_HEADER_SIZE
    if how == "half":
        os.truncate(path, size // 2)
        return size // 2, size
    os.remove(path)
    if how == "delete_with_index":
        os.remove(directory / filenames.index_name(int(name[:-4])))
    return 0, size


def damaged_copy(template: Template, tmp_path: Path, kind: str, how: str) -> tuple[Path, set[int]]:
    """A copy of the template log with ``kind`` damaged ``how``, and the offsets the
    damage may take (those of every batch whose bytes it touched)."""
    copy = tmp_path / "log"
    shutil.copytree(template.path, copy)
    name = template.kinds[kind]
    lost: set[int] = set()
    if name.endswith(".log"):
        data = (template.path / name).read_bytes()
        first, last = damage(copy, name, how)
        pos = SEGMENT_HEADER_SIZE
        while pos < len(data):
            header, _reason = read_batch_header(data, pos, len(data))
            assert header is not None
            if pos < last and first < pos + header.length:
                lost.update(range(header.base_offset, header.next_offset))
            pos += header.length
    else:
        damage(copy, name, how)
    return copy, lost


def cli(*args: object) -> tuple[int, str]:
    """Run the CLI's entry point in this process: its exit code and output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main([str(a) for a in args])
        except SystemExit as done:
            return int(done.code or 0), out.getvalue()
    return 0, out.getvalue()


def names_damage(text: str, template: Template, kind: str) -> bool:
    return template.kinds[kind] in text


def read_records(path: Path, *, read_only: bool) -> list[tuple[int, bytes, bytes | None]]:
    with compactlog.open(path, read_only=read_only) as log:
        return [(r.offset, r.key, r.value) for r in log.read()]


# -- every reader: the exact data, or an error naming the damaged file ---------------------


@pytest.mark.parametrize(("kind", "how"), _cases())
def test_a_read_only_view_gets_the_exact_data_or_an_error_naming_the_file(
    template, tmp_path, kind, how
):
    check_reader(template, tmp_path, kind, how, read_only=True)


@pytest.mark.parametrize(("kind", "how"), _cases())
def test_a_writable_open_gets_the_exact_data_or_an_error_naming_the_file(
    template, tmp_path, kind, how
):
    check_reader(template, tmp_path, kind, how, read_only=False)


def check_reader(template: Template, tmp_path: Path, kind: str, how: str, *, read_only: bool):
    copy, _lost = damaged_copy(template, tmp_path, kind, how)
    try:
        got = read_records(copy, read_only=read_only)
    except CompactLogError as error:
        assert names_damage(str(error), template, kind), str(error)
    else:
        assert got == template.records


@pytest.mark.parametrize(("kind", "how"), _cases())
def test_a_table_holds_the_exact_state_or_raises_naming_the_file(template, tmp_path, kind, how):
    copy, _lost = damaged_copy(template, tmp_path, kind, how)
    try:
        with compactlog.Table(copy, follow=False, raw=True) as table:
            got = dict(table.items())
    except CompactLogError as error:
        assert names_damage(str(error), template, kind), str(error)
    else:
        assert got == template.latest


@pytest.mark.parametrize(("kind", "how"), _cases())
def test_verify_passes_only_on_exact_data_and_names_the_file(template, tmp_path, kind, how):
    copy, _lost = damaged_copy(template, tmp_path, kind, how)
    code, output = cli("verify", copy)
    if code == 0:
        assert read_records(copy, read_only=True) == template.records
    else:
        assert code == 1, output
        problems = [line for line in output.splitlines() if "PROBLEM" in line]
        assert any(names_damage(line, template, kind) for line in problems), output


@pytest.mark.parametrize(("kind", "how"), _cases())
def test_repair_leaves_a_log_verify_passes_with_every_untouched_batch(
    template, tmp_path, kind, how
):
    copy, lost = damaged_copy(template, tmp_path, kind, how)
    code, output = cli("repair", copy, *(["--rebuild-meta"] if kind == "meta" else []))
    assert code == 0, output
    code, output = cli("verify", copy)
    assert code == 0, output
    got = read_records(copy, read_only=True)
    expected = {r[0]: r for r in template.records}
    assert all(expected.get(r[0]) == r for r in got), "a record that was never written"
    kept = {r[0] for r in got}
    dropped = sorted(o for o in expected if o not in kept and o not in lost)
    assert not dropped, f"repair dropped valid records {dropped[:10]}"
