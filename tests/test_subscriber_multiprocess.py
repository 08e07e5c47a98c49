"""Many subscribers in many processes while many writers append; one subscriber is killed
with ``kill -9`` mid-way and restarted.

Two writer processes append keyed batches in two phases; three durable subscriber processes
tail the log, logging every record they receive and every commit to a file of their own.
Between the writers' phases the test kills one subscriber (``SIGKILL``, at whatever instant
it happens to be: polling, logging or inside ``commit()``) and restarts it. Then it checks,
per subscriber: each run delivers records in offset order without gaps, starting exactly at
the position committed before it; nothing is skipped across the crash (at-least-once); and
the committed prefixes of all runs together are every record of the log exactly once.

The file doubles as the child processes' program: ``python this_file writer|subscriber ...``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import compactlog

SUBSCRIBERS = ["alpha", "béta", "gamma"]  # durable names, one of them non-ASCII
BATCHES_PER_PHASE = 120
MAX_BATCH = 40


# -- the child processes -----------------------------------------------------------------------


def writer_main(path: str, writer_id: int, control: str) -> None:
    rng = random.Random(writer_id)
    seq = 0
    with compactlog.open(path, sync="os") as log:
        for phase in (1, 2):
            if phase == 2:
                while not os.path.exists(os.path.join(control, "phase2")):
                    time.sleep(0.005)  # waiting for the test, not making time pass
            for i in range(BATCHES_PER_PHASE):
                n = rng.randint(1, MAX_BATCH)
                pairs = [
                    (b"w%d-%07d" % (writer_id, seq + j), b"v" * rng.randint(0, 30))
                    for j in range(n)
                ]
                log.append_batch(pairs)
                seq += n
                if i % 5 == 0:
                    log.flush()
            log.flush()


def subscriber_main(path: str, name: str, out_path: str, control: str, seed: int) -> None:
    rng = random.Random(seed)
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    done = os.path.join(control, "done")
    with compactlog.open(path, read_only=True) as log:
        sub = log.subscribe(name)
        # a leading newline ends a line the previous (killed) run may have left half-written
        os.write(out, f"\nSTART {sub.position} .\n".encode())
        while True:
            records = sub.poll(max_records=rng.randint(1, 150), timeout_s=0.05)
            if records:
                lines = "".join(f"R {r.offset} {r.key.decode()} .\n" for r in records)
                os.write(out, lines.encode())
                if rng.random() < 0.6:
                    sub.commit()
                    os.write(out, f"C {sub.committed} .\n".encode())
                continue
            if os.path.exists(done):
                end = int(Path(done).read_text())
                if sub.position >= end:
                    sub.commit()
                    os.write(out, f"C {sub.committed} .\nEND .\n".encode())
                    return


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *args])


# -- checking ------------------------------------------------------------------------------


def parse_runs(out_path: Path) -> list[dict]:
    """The runs of one subscriber: start position, deliveries, commits, whether it ended."""
    runs: list[dict] = []
    for line in out_path.read_text().split("\n"):
        parts = line.split()
        if not parts or parts[-1] != ".":
            continue  # empty, or cut short by the kill
        if parts[0] == "START":
            runs.append({"start": int(parts[1]), "delivered": [], "commits": [], "end": False})
        elif parts[0] == "R":
            runs[-1]["delivered"].append((int(parts[1]), parts[2]))
        elif parts[0] == "C":
            runs[-1]["commits"].append(int(parts[1]))
        elif parts[0] == "END":
            runs[-1]["end"] = True
    return runs


def check_subscriber(runs: list[dict], log_keys: list[str]) -> None:
    end = len(log_keys)
    assert runs and runs[-1]["end"], "the last run must finish"
    committed_prefixes: list[int] = []
    for k, run in enumerate(runs):
        offsets = [o for o, _key in run["delivered"]]
        # in order, without gaps, from the position the run started at
        assert offsets == list(range(run["start"], run["start"] + len(offsets)))
        assert all(key == log_keys[o] for o, key in run["delivered"])
        assert run["commits"] == sorted(run["commits"])
        if k + 1 < len(runs):
            resumed = runs[k + 1]["start"]
            last_logged_commit = run["commits"][-1] if run["commits"] else run["start"]
            last_delivered = offsets[-1] if offsets else run["start"] - 1
            # the restart resumes at what was committed: never past what was delivered
            # (nothing skipped), never before the last commit it logged (a kill between
            # commit() and logging it makes the real commit newer than the logged one)
            assert last_logged_commit <= resumed <= last_delivered + 1
            committed_prefixes.extend(range(run["start"], resumed))
        else:
            assert run["commits"][-1] == end
            committed_prefixes.extend(range(run["start"], end))
    # after its final commit: every record exactly once
    assert committed_prefixes == list(range(end))
    # and at least once overall
    assert {o for run in runs for o, _ in run["delivered"]} == set(range(end))


def wait_for_deliveries(out_path: Path, count: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        if out_path.exists() and out_path.read_text().count("\nR ") >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"{out_path.name}: fewer than {count} deliveries in time")


@pytest.mark.timeout(180)
def test_two_writers_three_subscribers_one_killed_and_restarted(tmp_path):
    path = str(tmp_path / "log")
    control = tmp_path / "control"
    control.mkdir()
    compactlog.open(path, segment_bytes=16 * 1024, sync="os").close()
    outs = {name: tmp_path / f"sub-{i}.out" for i, name in enumerate(SUBSCRIBERS)}
    with compactlog.open(path, read_only=True) as log:
        for name in SUBSCRIBERS:
            log.subscribe(name)  # durable from offset 0 before anything is written
    writers = [_spawn("writer", path, str(i), str(control)) for i in range(2)]
    subs = {
        name: _spawn("subscriber", path, name, str(outs[name]), str(control), str(i))
        for i, name in enumerate(SUBSCRIBERS)
    }
    deadline = time.monotonic() + 120
    try:
        victim = SUBSCRIBERS[0]
        wait_for_deliveries(outs[victim], 300, deadline)
        subs[victim].send_signal(signal.SIGKILL)
        assert subs[victim].wait() == -signal.SIGKILL
        (control / "phase2").touch()
        subs[victim] = _spawn("subscriber", path, victim, str(outs[victim]), str(control), "99")
        for writer in writers:
            assert writer.wait(timeout=max(deadline - time.monotonic(), 1)) == 0
        with compactlog.open(path, read_only=True) as log:
            end = log.end_offset
            records = list(log.read())
        # atomically: a subscriber may look at the file between a truncate and a write
        (control / "done.tmp").write_text(str(end))
        os.replace(control / "done.tmp", control / "done")
        for name, proc in subs.items():
            assert proc.wait(timeout=max(deadline - time.monotonic(), 1)) == 0, name
    finally:
        for proc in [*writers, *subs.values()]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # the log: every writer's batches whole, exactly once, in each writer's order
    assert [r.offset for r in records] == list(range(end))
    keys = [r.key.decode() for r in records]
    for writer_id in range(2):
        mine = [int(k.split("-")[1]) for k in keys if k.startswith(f"w{writer_id}-")]
        assert mine == list(range(len(mine)))
    runs = {name: parse_runs(out) for name, out in outs.items()}
    assert len(runs[SUBSCRIBERS[0]]) == 2  # killed once, restarted once
    for name in SUBSCRIBERS:
        check_subscriber(runs[name], keys)
    with compactlog.open(path, read_only=True) as log:
        assert log.subscribers() == dict.fromkeys(SUBSCRIBERS, end)


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    if role == "writer":
        writer_main(rest[0], int(rest[1]), rest[2])
    elif role == "subscriber":
        subscriber_main(rest[0], rest[1], rest[2], rest[3], int(rest[4]))
    else:
        raise SystemExit(f"unknown role {role!r}")
