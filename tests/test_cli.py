"""The operator CLI, run as a subprocess through the installed ``compactlog`` script.

Each test builds a real log with the library, runs commands the way an operator would and
checks the human output, the ``--json`` documents, the exit codes (0 ok, 1 found a
problem, 2 bad usage) and that errors are one line on stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import compactlog

BIN = Path(sys.executable).parent / "compactlog"
SCRIPT = str(BIN) if BIN.exists() else (shutil.which("compactlog") or "compactlog")
T0 = 1_700_000_000_000
KEYS = 300
RECORDS = 3000


def run(*args: object, check: int | None = 0, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``compactlog ARGS``; assert the exit code unless ``check`` is None."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("COMPACTLOG_DEBUG", None)
    result = subprocess.run(
        [SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env
    )
    if check is not None:
        assert result.returncode == check, (
            f"exit {result.returncode} != {check}\nstdout:\n{result.stdout}\n"
            f"stderr:\n{result.stderr}"
        )
    return result


def run_json(*args: object, check: int = 0) -> dict:
    return json.loads(run(*args, "--json", check=check).stdout)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("compactlog: error: ")
    return lines[0]


def key(i: int) -> bytes:
    return b"user:%04d" % i


def build_log(path: Path, **config: object) -> dict[bytes, bytes | None]:
    """3000 updates over 300 keys (every 10th a tombstone), small segments, per-record
    timestamps T0 + offset; returns the model (latest value per key)."""
    model: dict[bytes, bytes | None] = {}
    settings = {"segment_bytes": 16 * 1024, "sync": "os", **config}
    with compactlog.open(path, clock=lambda: T0, **settings) as log:
        for lo in range(0, RECORDS, 100):
            batch = []
            for i in range(lo, lo + 100):
                value = None if i % 10 == 9 else b"value-%d" % i
                batch.append((key(i % KEYS), value))
                model[key(i % KEYS)] = value
            log.append_batch(batch, timestamps_ms=[T0 + i for i in range(lo, lo + 100)])
        log.append(b"bin\xff", b"\x00\x01\xfe", timestamp_ms=T0 + RECORDS, headers={"h": b"x"})
        model[b"bin\xff"] = b"\x00\x01\xfe"
        log.flush()
    return model


@pytest.fixture(scope="module")
def base_log(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("base") / "log"
    build_log(path)
    return path


@pytest.fixture
def log_copy(base_log, tmp_path) -> Path:
    target = tmp_path / "log"
    shutil.copytree(base_log, target)
    return target


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def segment_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.log"))


# -- help and usage ------------------------------------------------------------------------


def test_help_lists_every_command_and_every_command_has_examples():
    from click.testing import CliRunner
    from compactlog.cli.main import COMMANDS, cli

    result = run("--help")
    for name in COMMANDS:
        assert name in result.stdout
    runner = CliRunner()
    paths = [[name] for name in COMMANDS]
    paths += [["config", "get"], ["config", "set"]]
    paths += [["subscribers", sub] for sub in ("list", "add", "remove", "seek")]
    for words in paths:
        page = runner.invoke(cli, [*words, "--help"])
        assert page.exit_code == 0, (words, page.output)
        assert "Examples:" in page.output, words


def test_bad_usage_exits_2_with_one_line(base_log, tmp_path):
    cases = [
        ("no-such-command",),
        ("meta",),  # missing PATH
        ("meta", base_log, "--bogus"),
        ("dump", base_log, "--limit", "many"),
        ("dump", base_log, "--key", "zz", "--key-encoding", "hex"),
        ("meta", tmp_path / "missing"),
        ("config", "get", base_log, "no_such_setting"),
        ("config", "set", base_log, "segment_bytes=lots"),
        ("config", "set", base_log, "no_such_setting=1"),
        ("subscribers", "seek", base_log, "billing"),
        ("subscribers", "add", base_log, "~transient"),
        ("create", tmp_path / "new", "-c", "compression=brotli"),
    ]
    for args in cases:
        line = one_error_line(run(*args, check=2))
        assert len(line) < 600, line
    (tmp_path / "notalog").mkdir()
    line = one_error_line(run("verify", tmp_path / "notalog", check=2))
    assert "not a compactlog log" in line and "notalog" in line


# -- create, meta, config --------------------------------------------------------------------


def test_create_meta_and_config(tmp_path):
    path = tmp_path / "new"
    created = run_json("create", path, "-c", "segment_bytes=1MiB", "-c", "retention_ms=2d")
    assert created["config"]["segment_bytes"] == 1 << 20
    assert created["config"]["retention_ms"] == 2 * 86_400_000
    assert "already exists" in one_error_line(run("create", path, check=1))

    meta = run_json("meta", path)
    for field in (
        "format_version",
        "start_offset",
        "end_offset",
        "cleaner_point",
        "tombstone_horizon",
        "log_id",
        "dirty_ratio",
        "uncleanable",
        "segments",
        "writers",
        "config",
    ):
        assert field in meta
    assert len(meta["log_id"]) == 32 and meta["tombstone_horizon"] == 0
    assert meta["end_offset"] == 0 and meta["uncleanable"] is None and meta["writers"] == []
    human = run("meta", path).stdout
    assert "dirty ratio" in human and "segment_bytes" in human and "1048576" in human

    assert run("config", "get", path, "segment_bytes").stdout.strip() == "1048576"
    assert run_json("config", "get", path, "retention_ms") == {"retention_ms": 172800000}
    changed = run_json("config", "set", path, "retention_ms=none", "compression=zstd")
    assert changed["changed"]["retention_ms"] == {"old": 172800000, "new": None}
    assert run_json("config", "get", path)["compression"] == "zstd"
    refused = one_error_line(run("config", "set", path, "cleanup_policy=delete", check=1))
    assert "cleanup_policy" in refused and "refusing" in refused
    assert "segment_bytes" in run("config", "get", path).stdout


# -- reading ---------------------------------------------------------------------------------


def test_segments_and_stats(base_log):
    document = run_json("segments", base_log)
    rows = document["segments"]
    assert len(rows) > 3
    assert sum(r["records"] for r in rows) == RECORDS + 1
    assert rows[-1]["state"] == "active" and rows[0]["state"] == "dirty"
    assert [r["base_offset"] for r in rows] == sorted(r["base_offset"] for r in rows)
    assert rows[0]["min_timestamp"] == T0 and rows[-1]["max_timestamp"] == T0 + RECORDS
    human = run("segments", base_log).stdout
    assert "base offset" in human and "active" in human

    stats = run_json("stats", base_log)
    assert stats["records"] == RECORDS + 1
    assert stats["tombstones"] == RECORDS // 10
    assert stats["distinct_keys"] == KEYS + 1 and stats["distinct_keys_exact"] is True
    assert stats["segment_count"] == len(rows)
    assert sum(stats["segment_fill_histogram"].values()) == len(rows)
    assert "tombstones" in run("stats", base_log).stdout


def test_dump_ranges_keys_encodings_and_tombstones(base_log):
    lines = run("dump", base_log, "--from", 5, "--to", 12).stdout.splitlines()
    assert lines[0].split()[:2] == ["offset", "timestamp"]
    body = lines[1:]
    assert [int(line.split()[0]) for line in body] == list(range(5, 12))
    assert "<tombstone>" in body[9 - 5] and "user:0009" in body[9 - 5]
    assert "value-5" in body[0]

    records = [
        json.loads(line)
        for line in run("dump", base_log, "--key", "user:0007", "--json").stdout.splitlines()
    ]
    assert [r["offset"] for r in records] == list(range(7, RECORDS, KEYS))
    assert {r["key"] for r in records} == {"user:0007"}
    assert records[0]["value"] == "value-7" and records[0]["timestamp"] == T0 + 7

    limited = run("dump", base_log, "--limit", 3, "--json").stdout.splitlines()
    assert len(limited) == 3
    last = json.loads(run("dump", base_log, "--from", RECORDS, "--json", "-e", "base64").stdout)
    assert last["key"] == "YmluLw==" or last["key"] == "Ymlu/w=="
    assert last["headers"] == {"h": "eA=="}
    hexed = json.loads(run("dump", base_log, "--from", RECORDS, "--json", "-e", "hex").stdout)
    assert hexed["key"] == b"bin\xff".hex() and hexed["value"] == "0001fe"
    text = run("dump", base_log, "--from", RECORDS).stdout
    assert "bin\\xff" in text and "\\x00\\x01\\xfe" in text
    tomb = json.loads(run("dump", base_log, "--from", 9, "--to", 10, "--json").stdout)
    assert tomb["tombstone"] is True and tomb["value"] is None


def test_get_latest_value(base_log):
    found = run_json("get", base_log, "user:0005")
    assert found["found"] is True and found["value"] == "value-2705"
    assert found["offset"] == 2705
    assert "value-2705" in run("get", base_log, "user:0005").stdout
    as_of = run_json("get", base_log, "user:0005", "--as-of", 2000)
    assert as_of["offset"] == 1805
    deleted = run("get", base_log, "user:0009", check=1)
    assert "deleted" in one_error_line(deleted)
    assert run_json("get", base_log, "user:0009", check=1)["deleted"] is True
    assert "not found" in one_error_line(run("get", base_log, "nobody", check=1))
    binary = run_json("get", base_log, b"bin\xff".hex(), "--key-encoding", "hex", "-e", "hex")
    assert binary["value"] == "0001fe"


def test_tail_prints_the_last_records(base_log):
    lines = run("tail", base_log, "-n", 4).stdout.splitlines()[1:]
    assert [int(line.split()[0]) for line in lines] == [
        RECORDS - 3,
        RECORDS - 2,
        RECORDS - 1,
        RECORDS,
    ]
    records = run("tail", base_log, "-n", 2, "--json").stdout.splitlines()
    assert [json.loads(r)["offset"] for r in records] == [RECORDS - 1, RECORDS]


# -- subscribers and retention -------------------------------------------------------------


def test_subscribers_add_list_seek_remove(log_copy):
    run("subscribers", "add", log_copy, "billing")
    added = run_json("subscribers", "add", log_copy, "search", "--at", 2500)
    assert added["committed"] == 2500
    assert "already exists" in one_error_line(
        run("subscribers", "add", log_copy, "billing", check=1)
    )
    listing = run_json("subscribers", "list", log_copy)
    rows = {r["name"]: r for r in listing["subscribers"]}
    assert rows["billing"]["committed"] == 0
    assert rows["billing"]["lag_records"] == RECORDS + 1
    assert rows["search"]["lag_records"] == RECORDS + 1 - 2500
    assert rows["billing"]["lag_bytes"] > rows["search"]["lag_bytes"] > 0
    assert rows["billing"]["status"] == "ok"
    human = run("subscribers", "list", log_copy).stdout
    assert "billing" in human and "lag records" in human

    moved = run_json("subscribers", "seek", log_copy, "billing", "--to", "end")
    assert moved["previous"] == 0 and moved["committed"] == RECORDS + 1
    by_time = run_json("subscribers", "seek", log_copy, "billing", "--to-timestamp", T0 + 1234)
    assert by_time["committed"] == 1234
    iso = run_json(
        "subscribers", "seek", log_copy, "billing", "--to-timestamp", "2023-11-14T22:13:20.100Z"
    )
    assert iso["committed"] == 100
    segments = run_json("segments", log_copy)["segments"]
    assert all(s["pending_subscribers"] == ["billing", "search"] for s in segments[-2:])
    assert all(s["pending_subscribers"] == ["billing"] for s in segments[:2])

    run("subscribers", "remove", log_copy, "search")
    assert one_error_line(run("subscribers", "remove", log_copy, "search", check=2))
    assert [r["name"] for r in run_json("subscribers", "list", log_copy)["subscribers"]] == [
        "billing"
    ]


def test_retention_strands_a_subscriber_that_verify_flags_and_repair_fixes(tmp_path):
    path = tmp_path / "events"
    build_log(path, cleanup_policy="delete", retention_bytes=40 * 1024, retention_ms=None)
    run("subscribers", "add", path, "slow")
    preview = run_json("retention", path, "--dry-run")
    assert preview["segments_deleted"] and preview["dry_run"] is True
    assert run_json("segments", path)["segments"][0]["base_offset"] == 0  # nothing removed
    done = run_json("retention", path)
    assert done["segments_deleted"] == preview["segments_deleted"]
    assert done["log_start_offset"] > 0

    listing = run("subscribers", "list", path, check=1)
    assert "stuck below log start" in listing.stdout
    report = run_json("verify", path, check=1)
    assert [p["kind"] for p in report["problems"]] == ["checkpoint"]
    assert "slow" in report["problems"][0]["message"]
    assert run_json("repair", path, "--dry-run", check=1)["fixes"]
    run("repair", path)
    run("verify", path)
    rows = run_json("subscribers", "list", path)["subscribers"]
    assert rows[0]["committed"] == done["log_start_offset"]


# -- corruption ----------------------------------------------------------------------------


def test_corrupt_log_verify_dump_repair(log_copy):
    victim = segment_files(log_copy)[1]
    clean = run_json("verify", log_copy)
    assert clean["ok"] is True and clean["records"] == RECORDS + 1
    assert run("verify", log_copy).stdout.strip().endswith("OK")
    flip_byte(victim, 16 + 60)  # inside the body of the segment's first batch

    report = run_json("verify", log_copy, check=1)
    assert report["ok"] is False
    problem = report["problems"][0]
    assert problem["kind"] == "corrupt_batch"
    assert problem["file"] == victim.name and problem["position"] == 16
    assert "CRC" in problem["message"]
    human = run("verify", log_copy, check=1).stdout
    assert f"{victim.name} at byte 16" in human and "FAILED" in human

    dumped = run("dump", log_copy, "--json", check=1)
    offsets = [json.loads(line)["offset"] for line in dumped.stdout.splitlines()]
    lost = int(victim.name[:20])
    assert offsets[:lost] == list(range(lost))  # everything before the damage
    assert offsets[-1] == RECORDS  # and everything after it
    assert lost not in offsets and len(offsets) == RECORDS + 1 - 100
    assert victim.name in dumped.stderr and "byte 16" in dumped.stderr

    dry = run_json("repair", log_copy, "--dry-run", check=1)
    assert any("quarantine" in fix for fix in dry["fixes"])
    assert not list(log_copy.glob("*.quarantine"))
    fixed = run("repair", log_copy)
    assert "quarantine" in fixed.stdout
    assert len(list(log_copy.glob("*.quarantine"))) == 1
    after = run_json("verify", log_copy)
    assert after["ok"] is True and after["records"] == RECORDS + 1 - 100
    assert any("quarantine" in note for note in after["notes"])
    run("dump", log_copy, "--limit", 5)
    assert run_json("repair", log_copy, "--dry-run")["clean"] is True


def test_torn_tail_and_bad_index_are_reported(log_copy):
    active = segment_files(log_copy)[-1]
    with open(active, "ab") as handle:
        handle.write(b"\x7f" * 30)
    index = log_copy / segment_files(log_copy)[0].name.replace(".log", ".idx")
    index.write_bytes(index.read_bytes()[:16] + b"\x05\x00\x00\x00\x99\x00\x00\x00")
    report = run_json("verify", log_copy, check=1)
    kinds = sorted(p["kind"] for p in report["problems"])
    assert kinds == ["index", "torn_tail"]
    torn = next(p for p in report["problems"] if p["kind"] == "torn_tail")
    assert torn["file"] == active.name and torn["position"] == active.stat().st_size - 30
    run("repair", log_copy)
    run("verify", log_copy)


# -- compaction ------------------------------------------------------------------------------


def test_compact_prints_statistics_and_keeps_the_latest_state(log_copy, base_log):
    model = build_log(log_copy.parent / "model")  # same content: the model
    before = run_json("stats", log_copy)["records"]
    result = run_json("compact", log_copy)
    assert result["forced"] is True and isinstance(result["stats"], dict)
    after = run_json("stats", log_copy)
    assert after["records"] < before
    for name in (b"user:0005", b"user:0123"):
        assert run_json("get", log_copy, name.decode())["value"] == model[name].decode()
    assert run_json("get", log_copy, "user:0009", check=1)["found"] is False
    run("verify", log_copy)
    human = run("compact", log_copy)
    assert "compaction done" in human.stdout or "no cleaning due" in human.stdout
    assert "\r" not in human.stdout + human.stderr  # no progress bar off a terminal


# -- a log another process is writing -------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, time, compactlog
    path, stop = sys.argv[1], sys.argv[2]
    import os
    with compactlog.open(path, sync="os") as log:
        n = 0
        while not os.path.exists(stop):
            log.append_batch([(b"live:%d" % (n % 50), b"v%d" % n) for _ in range(1)])
            n += 1
            if n % 10 == 0:
                log.flush()
            if n == 20:
                log.flush()
                print("ready", flush=True)
            time.sleep(0.002)
        log.flush()
        print(n, flush=True)
    """
)


@pytest.fixture
def live_writer(log_copy, tmp_path):
    stop = tmp_path / "stop"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(log_copy), str(stop)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    yield log_copy, child
    stop.touch()
    child.wait(timeout=30)


def test_commands_work_beside_a_writer_and_only_unsafe_changes_are_refused(live_writer):
    path, child = live_writer
    meta = run_json("meta", path)
    assert child.pid in [w["pid"] for w in meta["writers"]]
    assert meta["end_offset"] > RECORDS
    run("verify", path)
    run("segments", path)
    run("stats", path)
    assert run("dump", path, "--from", RECORDS + 1, "--limit", 5).stdout.count("live:") == 5
    run("get", path, "live:3")
    # safe beside a writer: no --force needed
    run("compact", path)
    run("retention", path)
    run("config", "set", path, "retention_ms=1d")
    run("subscribers", "add", path, "late")
    run("subscribers", "seek", path, "late", "--to", "end")
    # unsafe while a writer runs: refused, naming the writer and why
    for args, why in (
        (("repair", path), "repair truncates segments"),
        (
            ("config", "set", path, "segment_bytes=1MiB"),
            "writers read segment_bytes only when they open the log",
        ),
    ):
        line = one_error_line(run(*args, check=1))
        assert f"pid {child.pid}" in line and "--force" in line and why in line, line
    run("config", "set", path, "segment_bytes=1MiB", "--force")
    run("repair", path, "--dry-run", check=None)  # allowed: changes nothing
    assert run_json("subscribers", "list", path)["subscribers"][0]["name"] == "late"


def test_tail_follow_sees_appends_from_another_process(live_writer):
    path, _child = live_writer
    result = run("tail", path, "-n", 0, "-f", "--timeout", 1.5, "--json", "--interval", 0.05)
    offsets = [json.loads(line)["offset"] for line in result.stdout.splitlines()]
    assert len(offsets) >= 10
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert offsets[0] > RECORDS


# -- demo ------------------------------------------------------------------------------------


def test_demo_writes_reads_back_and_matches_its_model(tmp_path):
    path = tmp_path / "demo" / "log"
    started = time.monotonic()
    summary = run_json(
        "demo", "--quick", "--path", path, "--updates", 20_000, "--keys", 2_000, "--no-compact"
    )
    assert time.monotonic() - started < 30
    assert summary["records"] == summary["records_read"] == 20_000
    assert summary["latest_matches_model"] is True
    assert 0 < summary["latest_keys"] <= 2_000 and summary["tombstones"] > 0
    run("verify", path)
    human = run("demo", "--quick", "--path", path, "--updates", 5_000, "--keys", 500).stdout
    assert "matches the model" in human and "records/s" in human
    other = tmp_path / "precious"
    other.mkdir()
    (other / "thesis.txt").write_text("do not delete")
    assert "not removing" in one_error_line(run("demo", "--path", other, check=1))
    assert (other / "thesis.txt").exists()
