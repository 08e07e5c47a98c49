"""The docs, executed: every code block of README.md and docs/*.md runs as written, or is
compared with a real run, or says on its page why it cannot run (``tests/docs_runner.py``
reads the pages). The pages' hidden fixtures are below, each named on its page."""

from __future__ import annotations

import errno
import io
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import compactlog
from compactlog.archive.push import Archiver
from compactlog.archive.store import open_store
from compactlog.encoding.batch_encode import encode_batch
from compactlog.storage.cleaner_lock import CleanerLock

from .docs_runner import PAGES, ROOT, Block, DocError, PageRun, blocks_of, hexdump, run_page
from .helpers import batch_positions
from .test_compaction_failures import FaultFS

SPARK_PAGES = {"spark.md"}  # run by tests/spark/test_docs_spark.py, with the shared session
T = 1700000000000  # format.md's fixed clock


def service_orders(directory: Path, namespace: dict[str, Any]) -> None:
    """operator-guide.md §1: a service's log, 256 KiB segments, a 1 MiB precommit buffer and
    two durable subscribers, closed cleanly."""
    options = {"segment_bytes": 256 << 10, "precommit_bytes": 1 << 20, "clock": lambda: T}
    with compactlog.open(directory / "orders", **options) as log:
        for start in range(0, 6300, 100):
            log.append_batch([(b"order:%d" % n, b"x" * 104) for n in range(start, start + 100)])
        for name, position in (("billing", 3000), ("search-indexer", 6001)):
            with log.subscribe(name) as sub:
                sub.seek(position)
                sub.commit()


def compacted_batch(directory: Path, namespace: dict[str, Any]) -> None:
    """format.md §16.4: batch 1 of the worked example with only offset 1 kept."""
    batch = encode_batch(
        [b"user:2"], [b"Bob"], T + 5, offset_deltas=np.array([1], np.int32), last_delta=1
    )
    (directory / "compacted-batch").write_bytes(batch.to_bytes(0))


def precommit_example(directory: Path, namespace: dict[str, Any]) -> None:
    """format.md §16.5: ``pre_commit`` as it is after one append and before any flush."""
    with compactlog.open(directory / "pre", clock=lambda: T, precommit_bytes=4096) as log:
        log.append(b"user:1", b"Ada")
        (directory / "pre_commit").write_bytes((directory / "pre" / "pre_commit").read_bytes())


def billing_checkpoint(directory: Path, namespace: dict[str, Any]) -> str:
    """format.md §12: the checkpoint file of subscriber ``billing`` committed at 3000."""
    with compactlog.open(directory / "billing") as log:
        log.append_batch([(b"order:%d" % n, b"paid") for n in range(3000)])
        with log.subscribe("billing") as sub:
            sub.seek(3000)
            sub.commit()
    return (directory / "billing" / "cp.62696c6c696e67").read_text()


def customers_log(directory: Path, namespace: dict[str, Any]) -> None:
    """spark.md: ``data/customers-log``, customers as JSON values keyed by id."""
    rows = [(1, "Ada", 10.0), (2, "Bob", 2.5), (3, "Cy", 0.0), (1, "Ada", 12.0)]
    with compactlog.open(directory / "data" / "customers-log") as log:
        for id_, name, balance in rows:
            value = json.dumps({"id": id_, "name": name, "balance": balance}).encode()
            log.append(str(id_).encode(), value)


# -- the operator's messages (operator-guide.md §5, subscribers.md): provoked for real --------

SERVICE_LOG = "var/lib/app/orders"  # /var/lib/app/orders of the page, in its directory
HOLD_SUBSCRIBER = (
    "import sys, compactlog; log = compactlog.open(sys.argv[1]); sub = log.subscribe('billing');"
    "print('ready', flush=True); sys.stdin.read()"
)


def error_text(error: BaseException, directory: Path, qualified: bool = False) -> str:
    """The message as the page shows it: its paths absolute in the page's world."""
    name = type(error).__name__
    text = f"{type(error).__module__}.{name}: {error}" if qualified else f"{name}: {error}"
    return text.replace(str(directory), "")


def corrupt_orders(directory: Path, namespace: dict[str, Any]) -> str:
    """Three 68-byte batches, the middle one damaged: what a read then raises."""
    path = directory / SERVICE_LOG
    with compactlog.open(path, sync="always") as log:
        for _ in range(3):
            log.append(b"order:1", b"paid!")
    segment = path / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    data[84 + 50] ^= 0xFF
    segment.write_bytes(data)
    with (
        pytest.raises(compactlog.CorruptLogError) as raised,
        compactlog.open(path, read_only=True) as log,
    ):
        list(log.read())
    return error_text(raised.value, directory)


def repair_orders(directory: Path, namespace: dict[str, Any]) -> str:
    command = [str(Path(sys.executable).parent / "compactlog"), "repair", SERVICE_LOG]
    return subprocess.run(command, cwd=directory, capture_output=True, text=True).stdout


def provoked(path: Path, directory: Path) -> str:
    """What ``compactlog.open`` raises for the damaged log at ``path``; the page's next examples
    then find a healthy, empty log there."""
    with pytest.raises(compactlog.CompactLogError) as raised:
        compactlog.open(path).close()
    shutil.rmtree(path)
    compactlog.open(path).close()
    return error_text(raised.value, directory)


def missing_segment(directory: Path, namespace: dict[str, Any]) -> str:
    """operator-guide.md §5.2: segments at 0, 290 and 347 (a segment a batch: ``segment_ms``
    of 1 ms, a clock a second a batch), the middle one deleted with its index."""
    path = directory / SERVICE_LOG
    shutil.rmtree(path, ignore_errors=True)
    ticks = itertools.count(T, 1000)
    with compactlog.open(path, segment_ms=1, clock=lambda: next(ticks)) as log:
        for start, count in ((0, 290), (290, 57), (347, 20)):
            log.append_batch([(b"order:%d" % n, b"paid") for n in range(start, start + count)])
    for name in ("00000000000000000290.log", "00000000000000000290.idx"):
        (path / name).unlink()
    return provoked(path, directory)


def damaged_meta(directory: Path, namespace: dict[str, Any]) -> str:
    """operator-guide.md §5.2a: ``meta`` overwritten with bytes that are not JSON, then
    deleted."""
    path = directory / SERVICE_LOG
    said = []
    for damage in (lambda meta: meta.write_bytes(b"{ garbage"), Path.unlink):
        shutil.rmtree(path, ignore_errors=True)
        with compactlog.open(path) as log:
            log.append(b"order:1", b"paid")
        damage(path / "meta")
        said.append(provoked(path, directory))
    return "\n".join(said)


def durable_orders(directory: Path) -> Path:
    """operator-guide.md §5.2: 400 orders in batches of 10, in one segment, closed cleanly
    (the whole file is below the durable point); the segment's path."""
    path = directory / SERVICE_LOG
    shutil.rmtree(path, ignore_errors=True)
    with compactlog.open(path) as log:
        for start in range(0, 400, 10):
            log.append_batch([(b"order:%d" % n, b"paid") for n in range(start, start + 10)])
    return path / "00000000000000000000.log"


def damaged_last_batch(directory: Path) -> Path:
    """16 bytes of the last batch of :func:`durable_orders` overwritten; the log's path."""
    segment = durable_orders(directory)
    with open(segment, "r+b") as handle:
        handle.seek(batch_positions(segment)[-1][0] + 30)
        handle.write(b"\xff" * 16)
    return segment.parent


def durable_damage(directory: Path, namespace: dict[str, Any]) -> str:
    """operator-guide.md §5.2: the last batch damaged, the segment cut at its 21st batch, the
    segment deleted: the error of a read-only and of a writable open, which are the same."""
    said = []
    for damage in (
        lambda segment: None,
        lambda segment: os.truncate(segment, batch_positions(segment)[20][0]),
        os.remove,
    ):
        path = damaged_last_batch(directory)
        damage(path / "00000000000000000000.log")
        errors = []
        for read_only in (True, False):
            with (
                pytest.raises(compactlog.CompactLogError) as raised,
                compactlog.open(path, read_only=read_only, create=False) as log,
            ):
                list(log.read())
            errors.append(error_text(raised.value, directory))
        assert errors[0] == errors[1], errors
        said.append(errors[0])
    shutil.rmtree(path)
    return "\n".join(said)


def durable_repair(directory: Path, namespace: dict[str, Any]) -> str:
    """operator-guide.md §5.2: ``compactlog repair`` of the log whose last batch is damaged."""
    path = damaged_last_batch(directory)
    said = repair_orders(directory, namespace)
    shutil.rmtree(path)  # (the page's next example builds its own log there)
    return said


def second_cleaner(directory: Path, namespace: dict[str, Any]) -> str:
    path = str(directory / SERVICE_LOG)
    with CleanerLock(path), pytest.raises(compactlog.LogLockedError) as raised:
        CleanerLock(path).__enter__()
    return error_text(raised.value, directory)


def busy_subscriber(path: str, qualified: bool, directory: Path, namespace: dict) -> str:
    """``billing`` consumed by another process, then asked for here."""
    with compactlog.open(directory / path) as log:
        log.append(b"k", b"v")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_SUBSCRIBER, path],
        cwd=directory,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        with (
            compactlog.open(directory / path) as log,
            pytest.raises(compactlog.SubscriberBusyError) as raised,
        ):
            log.subscribe("billing")
    finally:
        holder.communicate("")
    return error_text(raised.value, directory, qualified)


def retention_skip(directory: Path, namespace: dict[str, Any]) -> str:
    """operator-guide.md §2c: 'worker-1' at 50 while retention moves the log start to 175, as
    the warning reads with logging's default format."""
    said = io.StringIO()
    handler = logging.StreamHandler(said)
    handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    logger = logging.getLogger("compactlog.subscriber")
    logger.addHandler(handler)
    options = {"cleanup_policy": "delete", "segment_bytes": 4096, "retention_bytes": 1}
    try:
        with compactlog.open(directory / "retained", **options) as log:
            for start in range(0, 200, 25):  # a segment each: 0, 25, ... 175 (active)
                log.append_batch([(b"k%d" % n, b"x" * 100) for n in range(start, start + 25)])
            with log.subscribe("worker-1") as sub:
                sub.seek(50)
                sub.commit()
            log.enforce_retention()
            with log.subscribe("worker-1") as sub:
                sub.poll(max_records=1)
    finally:
        logger.removeHandler(handler)
    return said.getvalue()


CLEANER_CONFIG = """\
roots = ["{root}/var/lib/app/logs"]

[[override]]
match = "orders-*"
min_cleanable_dirty_ratio = 0.2

[[override]]
match = "{root}/var/lib/app/logs/audit-*"
cleanup_policy = "compact,delete"
"""


def refused_override(directory: Path, namespace: dict[str, Any]) -> str:
    """operations.md: the page's second override, one `config set` would refuse, at ``--check``."""
    compactlog.open(directory / "var/lib/app/logs/audit-2024").close()
    config = directory / "etc/compactlog/cleaner.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(CLEANER_CONFIG.replace("{root}", str(directory)))
    cleaner = str(Path(sys.executable).parent / "compactlog-cleaner")
    run = subprocess.run([cleaner, "--config", str(config), "--check"], capture_output=True)
    assert run.returncode == 2, run
    return run.stderr.decode().replace(str(directory), "")


def disk_full(directory: Path, namespace: dict[str, Any]) -> str:
    """compaction.md: 30 rounds over 200 keys (19 segments), the ``.log.rw``'s first write
    failing with ``ENOSPC`` and 1,204,224 bytes said free (tests/test_compaction_failures.py's
    file system that fails on cue)."""
    fs, ticks = FaultFS(), itertools.count(T)
    options = {"_fs": fs, "segment_bytes": 64 << 10, "clock": lambda: next(ticks)}
    with compactlog.open(directory / SERVICE_LOG, **options) as log:
        for _ in range(30):
            log.append_batch([(b"order:%d" % k, b"x" * 100) for k in range(200)])
        fs.arm("write", errno.ENOSPC, lambda path: path.endswith(".log.rw"))
        fs.free = 1_204_224
        with pytest.raises(compactlog.DiskFullError) as raised:
            log.compact()
    return error_text(raised.value, directory, qualified=True)


def cli(*args: str, directory: Path, code: int = 0) -> subprocess.CompletedProcess[str]:
    """A command of the venv, run in the page's directory as an operator runs it."""
    command = [str(Path(sys.executable).parent / args[0]), *args[1:]]
    run = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    assert run.returncode == code, run
    return run


def cleaned_once(directory: Path, namespace: dict[str, Any]) -> None:
    """operations.md §1: a log under the root, one ``--once`` round of the service over it."""
    with compactlog.open(directory / "var/lib/app/logs/orders") as log:
        log.append_batch([(b"order:%d" % (n % 10), b"paid") for n in range(400)])
    cli("compactlog-cleaner", "--root", "var/lib/app/logs", "--once", directory=directory)


def refused_configs(directory: Path, namespace: dict[str, Any]) -> str:
    """operations.md §2: ``--check`` of a file with two mistakes and of a mistyped root, as a
    terminal shows them (each command, then its messages as comments)."""
    config = directory / "etc/compactlog/cleaner.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('root = "/var/lib/app/logs"\n\n[schedule]\ninterval_seconds = -1\n')
    shown = []
    for option, path in (
        ("--config", "/etc/compactlog/cleaner.toml"),
        ("--root", "/var/lib/app/logz"),
    ):
        run = cli(
            "compactlog-cleaner",
            option,
            f"{directory}{path}",
            "--check",
            directory=directory,
            code=2,
        )
        shown.append(f"compactlog-cleaner {option} {path} --check")
        shown += [f"# {line}" for line in run.stderr.replace(str(directory), "").splitlines()]
    return "\n".join(shown)


def checked_config(*flags: str) -> Callable[[Path, dict[str, Any]], None]:
    """operations.md §2: the page's file passes ``--check`` (with ``flags``); the log it
    names under /srv exists."""

    def check(directory: Path, namespace: dict[str, Any]) -> None:
        compactlog.open(directory / "srv/billing/ledger").close()
        config = "etc/compactlog/cleaner.toml"
        cli("compactlog-cleaner", "--config", config, *flags, "--check", directory=directory)

    return check


# -- the archive's pages, against the session's SeaweedFS (tests/archive/seaweed.py) --------

NOON_BEFORE = 1795690800000  # 2026-11-26T11:00:00Z: the drill's --as-of-time finds it


def archived_app(directory: Path, namespace: dict[str, Any]) -> None:
    """archive.md §8: a log archived at s3://bucket/app, its manifest an hour before noon."""
    with compactlog.open(directory / "app") as log:
        log.append_batch([(b"k%d" % n, b"v") for n in range(100)])
    with compactlog.open(directory / "app", read_only=True) as log:
        archiver = Archiver(log, open_store("s3://bucket/app"), clock=lambda: NOON_BEFORE)
        archiver.start()
        archiver.push()
        archiver.stop()


def no_such_bucket(directory: Path, namespace: dict[str, Any]) -> str:
    run = cli(
        "compactlog", "archive", "list", "s3://no-such-bucket/app", directory=directory, code=1
    )
    return run.stderr


S3_SETUPS = {"archived-app", "no-such-bucket"}


def misspelled_option(directory: Path, namespace: dict[str, Any]) -> str:
    """spark.md: a misspelled option, as Spark reports it."""
    read = namespace["spark"].read.format("compactlog").option("valueFromat", "json")
    with pytest.raises(Exception, match="PYTHON_DATA_SOURCE_ERROR") as raised:
        read.load(f"{namespace['DATA']}/customers-log")
    return f"{type(raised.value).__name__}: {raised.value}"


SETUPS = {
    "customers-log": customers_log,
    "service-orders": service_orders,
    "compacted-batch": compacted_batch,
    "precommit-example": precommit_example,
    "billing-checkpoint": billing_checkpoint,
    "corrupt-orders": corrupt_orders,
    "retention-skip": retention_skip,
    "refused-override": refused_override,
    "misspelled-option": misspelled_option,
    "repair-orders": repair_orders,
    "second-cleaner": second_cleaner,
    "durable-damage": durable_damage,
    "durable-repair": durable_repair,
    "disk-full": disk_full,
    "cleaned-once": cleaned_once,
    "refused-configs": refused_configs,
    "cleaner-config": checked_config(),
    "cleaner-archive-config": checked_config("--root", "var/lib/app/logs"),
    "archived-app": archived_app,
    "no-such-bucket": no_such_bucket,
    "missing-segment": missing_segment,
    "damaged-meta": damaged_meta,
    "busy-subscriber": partial(busy_subscriber, SERVICE_LOG, False),
    "busy-subscriber-srv": partial(busy_subscriber, "srv/orders.log", True),
}


def test_every_block_is_run_compared_or_marked_with_a_reason():
    unmarked = [b.where for page in PAGES for b in blocks_of(page) if b.kind == "unmarked"]
    assert not unmarked, f"neither run, compared nor marked skip (with a reason): {unmarked}"
    no_reason = [
        b.where
        for p in PAGES
        for b in blocks_of(p)
        if b.kind == "skip" and not b.directives["skip"]
    ]
    assert not no_reason, f"skipped without a reason: {no_reason}"
    named = {
        b.directives[d]
        for p in PAGES
        for b in blocks_of(p)
        for d in ("setup", "then")
        if d in b.directives
    }
    assert named <= set(SETUPS), f"pages name fixtures that do not exist: {named - set(SETUPS)}"


@pytest.mark.parametrize(
    "page", [p for p in PAGES if p.name not in SPARK_PAGES], ids=lambda p: p.name
)
def test_the_page_runs_as_written(page: Path, tmp_path: Path, request: pytest.FixtureRequest):
    if any(b.directives.get("setup") in S3_SETUPS for b in blocks_of(page)):
        request.getfixturevalue("seaweed")  # one S3 server for the session, AWS_* set
    run_page(page, tmp_path, SETUPS)


# -- the runner itself ---------------------------------------------------------------


def page_of(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_a_failing_block_is_reported_with_its_page_and_line(tmp_path: Path):
    page = page_of(tmp_path, "x\n\n```python\nx = 1\n```\n\n```python\n1 / 0\n```\n")
    with pytest.raises(DocError, match=r"page.md:7: ZeroDivisionError"):
        run_page(page, tmp_path, {})


def test_an_output_block_must_match_the_run(tmp_path: Path):
    ok = "```python\nprint('pid', 42)\n```\n<!-- doc: output -->\n```\npid ...\n```\n"
    run_page(page_of(tmp_path, ok), tmp_path, {})
    wrong = ok.replace("pid ...", "pid 7")
    with pytest.raises(DocError, match="the output differs"):
        run_page(page_of(tmp_path, wrong), tmp_path, {})


def test_a_setups_text_is_the_output_compared_wrapped_or_in_part(tmp_path: Path):
    said = {"say": lambda d, ns: f"Error: {d}/x: in use by pid 77; close\nit first\ndone"}
    message = "Error: x: in use by\npid 4242; close it first done"
    wrapped = f"<!-- doc: setup say; output wrapped -->\n```\n{message}\n```\n"
    run_page(page_of(tmp_path, wrapped), tmp_path, said)
    part = "<!-- doc: setup say; output part -->\n```\n  it first\n```\n"
    run_page(page_of(tmp_path, part), tmp_path, said)
    with pytest.raises(DocError, match="the output differs"):
        run_page(page_of(tmp_path, part.replace("it first", "it last")), tmp_path, said)


def test_a_listing_and_a_dump_are_compared_with_the_files(tmp_path: Path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".lock").write_bytes(b"CLHD" + bytes(92))
    dump = "\n".join(hexdump(b"CLHD" + bytes(92))[:2])
    listing = "-rw-r--r-- 1 app app 96 Nov 22 00:32 .lock"
    text = (
        f"<!-- doc: listing d -->\n```\n{listing}\n```\n"
        f"<!-- doc: dump d/.lock -->\n```\n{dump}\n```\n"
    )
    run_page(page_of(tmp_path, text), tmp_path, {})
    with pytest.raises(DocError, match="the directory holds"):
        run_page(page_of(tmp_path, text.replace(" 96 ", " 64 ")), tmp_path, {})
    with pytest.raises(DocError, match="the file holds"):
        run_page(page_of(tmp_path, text.replace("434c", "0000")), tmp_path, {})


def test_a_shell_block_runs_in_the_pages_directory_with_the_venv_on_path(tmp_path: Path):
    session = PageRun(tmp_path, {})
    session.run(Block(tmp_path, 1, "sh", "compactlog --help > /dev/null; pwd\n"))
    assert session.last_output.strip() == str(tmp_path)


def test_a_file_block_is_written_and_a_then_fixture_checks_it(tmp_path: Path):
    said = {"read": lambda d, ns: (d / "etc/compactlog/x.toml").read_text()}
    session = PageRun(tmp_path, said)
    directives = {"file": "etc/compactlog/x.toml", "then": "read"}
    session.run(Block(tmp_path, 1, "toml", 'roots = ["/srv/a"]\n', directives))
    assert session.last_output == f'roots = ["{tmp_path}/srv/a"]\n'


def test_shell_blocks_find_the_pages_world_below_its_directory(tmp_path: Path):
    session = PageRun(tmp_path, {})
    (tmp_path / "var/lib/app").mkdir(parents=True)
    session.run(Block(tmp_path, 1, "sh", "echo /var/lib/app/ s3://b/srv/x /etc/passwd\n"))
    assert session.last_output.split() == [
        f"{tmp_path}/var/lib/app/",
        "s3://b/srv/x",
        "/etc/passwd",
    ]


def test_the_hexdump_is_xxds_layout():
    assert hexdump(b"CLOGIDX\0\1\0\0\0\0\0\0\0\2\0\0\0r\0\0\0") == [
        "00000000: 434c 4f47 4944 5800 0100 0000 0000 0000  CLOGIDX.........",
        "00000010: 0200 0000 7200 0000                      ....r...",
    ]


# -- paths the docs name ------------------------------------------------------------------

# Paths the docs name as examples of a user's or an operator's files, not the repository's.
EXAMPLE_PATHS = re.compile(r"^(/|~|\.\./|\$|<|data/|orders|users|events|ex/)")
REPO_DIRS = ("compactlog/", "tests/", "benchmarks/", "docs/", "deploy/", "cli/", "cleaner/")
# Written by a benchmark's first run on a quiet machine (the page says so), not before.
NOT_YET = {"docs/bench_scale.json", "docs/bench_scale.png"}
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
CODE = re.compile(r"`([^`\s]+)`")


def named_paths(page: Path) -> list[tuple[str, str]]:
    """(kind, path) of every relative link and every backquoted repository path of a page."""
    text = page.read_text(encoding="utf-8")
    found = [("link", m) for m in LINK.findall(text) if "://" not in m]
    for word in CODE.findall(text):
        word = word.rstrip(".,:;")
        if word.startswith(REPO_DIRS) and not EXAMPLE_PATHS.match(word):
            path = word.split("::")[0].split(":")[0]
            # a pattern (`fixtures/<workload>-....json`): its folder must exist
            found.append(("path", path.rpartition("/")[0] if "<" in path else path))
    return found


def test_every_relative_link_and_named_repository_path_exists():
    missing = []
    for page in PAGES:
        for kind, name in named_paths(page):
            base = page.parent if kind == "link" else ROOT
            if name in NOT_YET:
                continue
            if not (base / name).exists() and not (ROOT / name).exists():
                missing.append(f"{page.relative_to(ROOT)}: {kind} {name}")
    assert not missing, "\n".join(missing)


def test_every_module_attribute_the_docs_name_imports():
    """``"snapshot": "compactlog.cli.commands_spark:snapshot"`` as ``COMMANDS`` spells it."""
    import importlib

    missing = []
    for page in PAGES:
        for module, attribute in re.findall(r'"(compactlog\.[\w.]+):(\w+)"', page.read_text()):
            try:
                getattr(importlib.import_module(module), attribute)
            except (ImportError, AttributeError):
                missing.append(f"{page.relative_to(ROOT)}: {module}:{attribute}")
    assert not missing, "\n".join(missing)


def test_the_pytest_options_the_docs_quote_are_pyprojects():
    pyproject = (ROOT / "pyproject.toml").read_text()
    for page in PAGES:
        for quoted in re.findall(r"`(addopts = .*?)`", page.read_text()):
            assert quoted in pyproject, f"{page.relative_to(ROOT)} quotes {quoted}"
