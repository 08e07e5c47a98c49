"""What a Python user expects of a package (issue 18, item 6): ``python -m compactlog``,
the classes the API returns exported at the top level with precise annotations, and a
read-only open that can wait for a log another process has yet to create."""

from __future__ import annotations

import ast
import builtins
import subprocess
import sys
import textwrap
import time
import types
import typing
from pathlib import Path

import pytest

import compactlog
from compactlog import log as log_module
from compactlog.storage import logdirs


def test_python_m_compactlog_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "compactlog", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: compactlog")


@pytest.mark.parametrize(
    ("method", "returned"),
    [("subscribe", "Subscriber"), ("compact", "CleanerStats"), ("snapshot", "Snapshot")],
)
def test_methods_name_what_they_return_and_it_is_exported(method, returned):
    exported = getattr(compactlog, returned)
    assert returned in compactlog.__all__
    names = {**vars(log_module), returned: exported}  # (imported there for type checkers only)
    hints = typing.get_type_hints(getattr(compactlog.Log, method), names)
    assert hints["return"] is exported


def test_a_read_only_open_waits_for_a_log_another_process_creates(tmp_path, monkeypatch):
    path, go = tmp_path / "log", tmp_path / "go"
    creator = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import os, sys, time, compactlog
                while not os.path.exists(sys.argv[2]):
                    time.sleep(0.01)
                with compactlog.open(sys.argv[1]) as log:
                    log.append(b"k", b"made by another process")
                """
            ),
            str(path),
            str(go),
        ]
    )
    waits = []

    def sleep(seconds: float) -> None:  # the first pause proves it waited: now make the log
        waits.append(seconds)
        go.touch()
        time.sleep(seconds)

    fake_time = types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep)
    monkeypatch.setattr(logdirs, "time", fake_time)  # (wait_for_log's clock and sleep)
    try:
        with compactlog.open(path, read_only=True, wait=True) as log:
            assert waits
            # the meta file may come before the first record: a reader waits for that too
            records = []
            while not records:
                records = list(log.read())
                time.sleep(0.01)
    finally:
        assert creator.wait(timeout=60) == 0
    assert [r.value for r in records] == [b"made by another process"]


def test_waiting_for_a_log_ends_with_a_clear_error(tmp_path):
    with pytest.raises(compactlog.NotALogError, match=r"no log appeared here within 0.05 s"):
        compactlog.open(tmp_path / "never", read_only=True, wait=0.05)


@pytest.mark.parametrize("wait", [-1, "5", None])
def test_a_bad_wait_is_refused(tmp_path, wait):
    with pytest.raises(compactlog.ConfigError, match="wait must be"):
        compactlog.open(tmp_path / "never", read_only=True, wait=wait)


def test_wait_is_refused_on_an_open_that_creates(tmp_path):
    with pytest.raises(compactlog.ConfigError, match="wait= is for read_only"):
        compactlog.open(tmp_path / "log", wait=True)


@pytest.mark.parametrize(
    ("old", "attribute"),
    [
        ("compactlog.subscriber", "lag_report"),
        ("compactlog.serde", "deserializers"),
        ("compactlog.aio", "wait_until"),
        ("compactlog.invariants", "check"),
        ("compactlog.table", "Table"),
        ("compactlog.archive.errors", "ArchiveError"),
    ],
)
def test_module_paths_the_docs_gave_still_import(old, attribute):
    """docs/ told users to import these before the modules moved into layer folders."""
    done = subprocess.run(
        [sys.executable, "-c", f"from {old} import {attribute}; import {old} as m; print(m)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_the_archives_errors_are_the_ones_of_the_exception_tree():
    from compactlog.archive import errors as old_home

    assert old_home.ArchiveError is compactlog.errors.ArchiveError
    assert issubclass(compactlog.errors.LeaseLostError, compactlog.CompactLogError)


def _exception_classes(tree: ast.Module, known: set[str]) -> list[ast.ClassDef]:
    """The classes of ``tree`` with a base among ``known`` (``lockfile.LockHeld`` counts as
    ``LockHeld``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {getattr(b, "id", None) or getattr(b, "attr", None) for b in node.bases}
            if bases & known:
                found.append(node)
    return found


def test_every_exception_class_of_the_library_is_in_errors_py():
    """One small exception tree (the house style): every exception class of the
    library (``compactlog/``, the archive included) is defined in ``compactlog/errors.py``,
    where a reader sees the whole tree; a class private to one module (``_Name``, never
    raised to a caller) may stay beside the code that catches it."""
    package = Path(compactlog.__file__).parent
    trees = {path: ast.parse(path.read_text()) for path in sorted(package.rglob("*.py"))}
    known = {name for name, value in vars(builtins).items() if isinstance(value, type)}
    known = {name for name in known if issubclass(getattr(builtins, name), BaseException)}
    while True:  # subclasses of subclasses, across modules
        more = {c.name for tree in trees.values() for c in _exception_classes(tree, known)}
        if more <= known:
            break
        known |= more
    elsewhere = [
        f"{path.relative_to(package.parent)}:{node.lineno} {node.name}"
        for path, tree in trees.items()
        if path != package / "errors.py"
        for node in _exception_classes(tree, known)
        if not node.name.startswith("_")
    ]
    assert not elsewhere, "exception classes outside compactlog/errors.py: " + ", ".join(elsewhere)
