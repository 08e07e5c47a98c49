"""``compactlog compact`` shows a pass's progress on stderr and keeps stdout's contract
(issue 8, part 3): a bar on a terminal, plain lines in a pipe, JSON Lines on request."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess

import pytest

import compactlog

from .test_cli import SCRIPT, run


@pytest.fixture
def log_path(tmp_path):
    path = tmp_path / "log"
    with compactlog.open(path, segment_bytes=8192, sync="os", segment_ms=None) as log:
        for start in range(0, 4000, 100):
            log.append_batch(
                [(b"key-%04d" % (i % 300), b"v" * 50) for i in range(start, start + 100)]
            )
    return path


def _phases(events: list[dict]) -> list[str]:
    return [
        e["phase"] for i, e in enumerate(events) if i == 0 or events[i - 1]["phase"] != e["phase"]
    ]


def test_plain_lines_in_a_pipe_start_and_end_each_phase(log_path):
    result = run("compact", log_path)
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("compactlog: progress: ") for line in lines)
    assert lines[0].startswith("compactlog: progress: map 0 B of ")
    assert lines[-1].startswith("compactlog: progress: rewrite ") and "(100%)" in lines[-1]
    assert "\r" not in result.stderr  # no bar off a terminal
    assert "compaction done" in result.stdout


def test_json_keeps_one_document_on_stdout_and_progress_json_streams_events_on_stderr(log_path):
    result = run("compact", log_path, "--json", "--progress", "json")
    document = json.loads(result.stdout)  # stdout: still exactly one document
    assert document["stats"]["cleaned"] is True
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert _phases(events)[0] == "map" and _phases(events)[-1] == "rewrite"
    for event in events:
        assert set(event) == {"phase", "bytes_done", "bytes_planned"}
        assert 0 <= event["bytes_done"] <= event["bytes_planned"]
    rewrite = [e for e in events if e["phase"] == "rewrite"]
    assert rewrite[-1]["bytes_done"] == document["stats"]["bytes_read"]


def test_json_alone_prints_no_progress(log_path):
    result = run("compact", log_path, "--json")
    json.loads(result.stdout)
    assert result.stderr == ""


def test_a_terminal_gets_a_bar_with_bytes_rate_and_eta(log_path):
    """Under a pseudo-terminal the bar draws (and erases itself: it is transient)."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    with subprocess.Popen(
        [SCRIPT, "compact", str(log_path), "--progress", "bar"],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=follower,
        env=env,
    ) as process:
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            drawn += chunk
        stdout = process.stdout.read() if process.stdout else b""
        assert process.wait(timeout=60) == 0
    os.close(leader)
    assert b"compaction done" in stdout
    assert b"rewriting" in drawn or b"building the offset map" in drawn, drawn[:500]


def test_the_bar_says_mib_like_the_summary():
    """One unit: the bar's sizes and rate and the summary's sizes are all binary (MiB),
    never rich's decimal MB/s beside them."""
    from compactlog.cli.progress import ProgressDisplay

    from compactlog.compaction.progress import CompactionProgress
    from compactlog.compaction.stats import CleanerStats

    now = [0.0]
    with ProgressDisplay("bar", clock=lambda: now[0]) as display:
        for second in range(4):
            now[0] = float(second)
            display(CompactionProgress("rewrite", second * 3 << 20, 12 << 20))
        task = display.bar.tasks[0]
        drawn = " ".join(str(getattr(c(task), "plain", c(task))) for c in display.bar.columns)
    assert "MiB/s" in drawn and "3.0 MiB/s" in drawn, drawn
    summary = CleanerStats(cleaned=True, bytes_read=5 << 20, bytes_written=1 << 20).summary()
    assert "5.0 MiB of log processed" in summary and " MB" not in summary, summary


def test_compact_help_lists_force_as_docs_cli_md_says():
    out = run("compact", "--help").stdout
    assert "--force" in out and "No effect" in out, out


def test_ctrl_c_exits_130_naming_the_log_and_leaves_it_whole(tmp_path):
    path = tmp_path / "log"
    with compactlog.open(path, segment_bytes=8192, segment_ms=None) as log:
        for start in range(0, 20000, 100):
            log.append_batch([(b"k%04d" % (i % 300), b"v" * 50) for i in range(start, start + 100)])
    # a pass throttled to 64 KiB/s takes about 20 s: long enough to be interrupted
    run("config", "set", path, "cleaner_io_bytes_per_second=65536")
    with subprocess.Popen(
        [SCRIPT, "compact", str(path), "--progress", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stderr is not None
        first = process.stderr.readline()
        assert json.loads(first)["phase"], first  # the pass is under way
        process.send_signal(signal.SIGINT)
        stderr = process.stderr.read()
        assert process.wait(timeout=60) == 130
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"compactlog: error: {path}: interrupted by Ctrl-C (SIGINT)"), last
    run("verify", path)
