"""Real ``kill -9`` of a cleaning process, at random moments, 50+ times.

Each round: the test appends more keyed records (with tombstones) to a log of 50+
segments, starts a child process that runs forced compactions in a loop with a small
offset map (partial passes, many swaps), kills it with SIGKILL after a random delay, then
reopens the log (recovery resolves any interrupted swap) and checks Kafka's guarantees
against the model. In the last rounds another process appends while the cleaner runs.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import compactlog
from compactlog.storage.segment import list_segments

from .compaction_helpers import Model, check_log, rewrite_files

REPO = Path(__file__).resolve().parents[1]
CONFIG = dict(
    segment_bytes=1024, cleaner_buffer_bytes=4096, sync="os", segment_ms=None, retention_ms=None
)
CLEAN_ROUNDS = 46
APPEND_ROUNDS = 6

CLEANER = r"""
import sys
import compactlog
log = compactlog.open(sys.argv[1])
print("ready", flush=True)
while True:
    log.compact(force=True)
"""

APPENDER = r"""
import sys
import compactlog
log = compactlog.open(sys.argv[1])
count = int(sys.argv[2])
print("ready", flush=True)
for i in range(count):
    log.append(b"ap%d" % (i % 7), b"%d" % i)
    if i % 10 == 9:
        log.flush()
log.flush()
log.close()
print("done", flush=True)
"""


def spawn(script: str, *args: str) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"ready"
    return child


def kill(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait()
    if child.stdout is not None:
        child.stdout.close()


def append_round(path: Path, model: Model, rng: random.Random, records: int) -> None:
    with compactlog.open(path, **CONFIG) as log:
        for _ in range(records // 5):
            pairs = []
            for _ in range(5):
                key = b"key%02d" % rng.randrange(40)
                value = None if rng.random() < 0.1 else b"v%08d" % rng.randrange(10**8)
                pairs.append((key, value))
            model.append_batch(log, pairs)


def check_appender(log, count: int, model: Model) -> None:
    """Records of the concurrent appender: each key's last value present, in order."""
    last: dict[bytes, bytes] = {}
    for i in range(count):
        last[b"ap%d" % (i % 7)] = b"%d" % i
    seen: dict[bytes, bytes] = {}
    previous = -1
    for record in log.read():
        assert record.offset > previous
        previous = record.offset
        if record.key.startswith(b"ap"):
            seen[record.key] = record.value
        else:
            assert model.written[record.offset] == (record.key, record.value)
    assert seen == last


def test_kill_9_during_compaction_never_loses_or_duplicates(tmp_path):
    rng = random.Random(4)
    path = tmp_path / "log"
    model = Model()
    append_round(path, model, rng, 1500)
    with compactlog.open(path) as log:
        assert len(list_segments(log.directory)) >= 50
    kills = 0
    for _ in range(CLEAN_ROUNDS):
        append_round(path, model, rng, 60)
        child = spawn(CLEANER, str(path))
        time.sleep(rng.uniform(0.0, 0.25))
        kill(child)
        kills += 1
        with compactlog.open(path) as log:
            assert rewrite_files(path) == []
            check_log(log, model)
    assert kills >= CLEAN_ROUNDS


def test_kill_9_of_the_cleaner_while_another_process_appends(tmp_path):
    rng = random.Random(9)
    path = tmp_path / "log"
    model = Model()
    append_round(path, model, rng, 1200)
    appended = 0
    for _ in range(APPEND_ROUNDS):
        cleaner = spawn(CLEANER, str(path))
        appender = spawn(APPENDER, str(path), "300")
        time.sleep(rng.uniform(0.0, 0.3))
        kill(cleaner)
        assert appender.wait(timeout=60) == 0
        appender.stdout.close()
        appended = 300  # every round restarts the sequence: the last round's values win
        with compactlog.open(path) as log:
            assert rewrite_files(path) == []
            check_appender(log, appended, model)
            log.compact(force=True)
            check_appender(log, appended, model)


def test_an_undone_swap_rebuilds_the_index_at_the_logs_interval(tmp_path: Path) -> None:
    """Undoing a swap that died after renaming the new index over the old one (step 3)
    rebuilds the first segment's index from the old segment at the interval the writer and
    the cleaner use (``index_interval_bytes``), not at a fixed one."""
    import json

    from compactlog.storage import filenames, swap
    from compactlog.storage.fsio import DEFAULT_FS
    from compactlog.storage.segment import index_path, read_index, segment_path

    directory = tmp_path / "log"
    with compactlog.open(directory, index_interval_bytes=64) as log:
        log.append_batch([(b"k%d" % i, b"v" * 40) for i in range(200)])
        for i in range(200):
            log.append(b"k%d" % i, b"w" * 40)
    entries = len(read_index(str(directory), 0))
    assert entries > 100
    # a swap that died after step 3 of its protocol: intent written, new index renamed in,
    # the .log.rw still there (so the undo runs)
    (directory / filenames.SWAP_INTENT).write_text(json.dumps({"first": 0, "others": []}))
    rewrite = filenames.rewrite_name(segment_path(str(directory), 0))
    Path(rewrite).write_bytes(b"")
    Path(index_path(str(directory), 0)).write_bytes(b"")  # the new index, now wrong
    messages = swap.resolve_interrupted_swap(DEFAULT_FS, str(directory))
    assert messages and "rolled back" in messages[0]
    assert len(read_index(str(directory), 0)) >= entries
    with compactlog.open(directory) as log:
        assert len(list(log.read())) == 400
