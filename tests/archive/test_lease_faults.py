"""One archiver per archive, and no failure that makes a manifest name a missing object:
racing archivers, a killed holder, injected request failures, ``kill -9`` at random points,
and the S3 server itself restarted mid-run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import compactlog
from compactlog.archive import FaultyStore, LeaseHeldError, StoreError, open_store
from compactlog.archive import manifest as manifests
from compactlog.archive.lease import LEASE_KEY, Lease
from compactlog.archive.push import Archiver
from compactlog.archive.restore import restore
from compactlog.archive.verify import verify

from .helpers import Model, new_log, state_of

BIN = Path(sys.executable).parent / "compactlog"


def test_two_archivers_racing_exactly_one_holds_the_lease(tmp_path, s3_url):
    store = open_store(s3_url)
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def contend() -> None:
        lease = Lease(store, log="racer")
        barrier.wait()
        try:
            lease.acquire()
            outcomes.append("held")
        except LeaseHeldError as error:
            outcomes.append(str(error))

    threads = [threading.Thread(target=contend) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("held") == 1
    refused = [o for o in outcomes if o != "held"]
    assert all(f"pid {os.getpid()}" in o and "since" in o and "host" in o for o in refused)


def test_a_dead_local_holder_is_taken_over_at_once_a_live_remote_one_is_not(memory_url):
    store = open_store(memory_url)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    holder = Lease(store, log="first")
    holder.acquire()
    data, etag = store.get(LEASE_KEY)
    body = json.loads(data)
    body["pid"] = dead.pid  # as a kill -9 leaves it: unexpired, its process gone
    store.put_if_match(LEASE_KEY, json.dumps(body).encode(), etag)
    successor = Lease(store, log="second")
    successor.acquire()  # at once, though the lease has not expired

    data, etag = store.get(LEASE_KEY)
    body = json.loads(data)
    body["host"] = "elsewhere"
    store.put_if_match(LEASE_KEY, json.dumps(body).encode(), etag)
    with pytest.raises(LeaseHeldError, match="host elsewhere"):
        Lease(store).acquire()
    data, etag = store.get(LEASE_KEY)
    body["expires_ms"] = 1  # ... until it expires
    store.put_if_match(LEASE_KEY, json.dumps(body).encode(), etag)
    Lease(store).acquire()


def test_injected_failures_never_commit_a_manifest_naming_a_missing_object(tmp_path, s3_url):
    rng = random.Random(21)
    source = tmp_path / "source"
    log = new_log(source)
    reader = compactlog.open(source, read_only=True)
    inner = open_store(s3_url)

    def plan(op, key):
        if op in ("put", "put_if_absent", "get", "list", "head") and rng.random() < 0.15:
            return rng.choice(("before", "after"))
        return None

    store = FaultyStore(inner, plan)
    archiver = started(Archiver(reader, store))
    model = Model()
    failures = 0
    for round_ in range(15):
        failures += faulty_round(log, archiver, model, rng, round_)
        newest = manifests.latest(inner)
        if newest is not None:  # every committed manifest names only complete objects
            for segment in newest.segments:
                for ref in segment.objects:
                    assert inner.head(ref.key) is not None, ref.key
    store.plan = lambda op, key: None
    final = archiver.push()
    archiver.stop()
    reader.close()
    end = log.end_offset
    log.close()
    assert failures > 0 and store.failures > 0
    assert verify(inner).ok
    assert final.end_offset == end
    restore(inner, str(tmp_path / "restored"))
    assert state_of(tmp_path / "restored") == model.state(end)


def started(archiver: Archiver) -> Archiver:
    """Take the lease through the faults (each try either holds it or changes nothing)."""
    for _ in range(50):
        try:
            archiver.start()
            return archiver
        except StoreError:
            continue
    raise AssertionError("could not take the lease in 50 tries")


def faulty_round(log, archiver: Archiver, model: Model, rng: random.Random, round_: int) -> int:
    """Appends (a compaction every 4th round) and a push that may fail: 1 if it did."""
    model.append(log, rng, rng.choice((3, 50, 150)))
    if round_ % 4 == 3:
        log.compact(force=True)
    try:
        archiver.push()
    except StoreError:
        return 1
    return 0


def caught_up(store, end: int, archiver: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until the archive holds offsets up to ``end``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        newest = manifests.latest(store)
        if newest is not None and newest.end_offset >= end:
            return
        assert archiver.poll() is None, "the archiver exited"
        time.sleep(0.05)
    raise AssertionError(f"the archive did not reach offset {end} in {timeout}s")


def _run_archiver(log: Path, url: str, log_file) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN), "archive", "run", str(log), url, "--interval", "0.1s", "--retention", "0s"],
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )


def test_kill_9_at_random_points_then_restart(tmp_path, s3_url):
    """The archiver (``compactlog archive run``) is killed with SIGKILL at random moments
    while a writer appends and compacts; each successor takes the lease at once. No
    manifest ever names a missing object, and nothing archived is lost."""
    rng = random.Random(31)
    source = tmp_path / "source"
    log = new_log(source)
    model = Model()
    model.append(log, rng, 100)
    store = open_store(s3_url)
    ends: list[int] = []
    with open(tmp_path / "archiver.out", "ab") as out:
        for _ in range(3):
            archiver = _run_archiver(source, s3_url, out)
            caught_up(store, log.end_offset, archiver)  # it runs (starting takes seconds)
            deadline = time.monotonic() + rng.uniform(0.0, 1.0)  # then dies at a random point
            while time.monotonic() < deadline:
                model.append(log, rng, rng.choice((1, 20, 120)))
                if rng.random() < 0.2:
                    log.compact(force=True)
                time.sleep(0.01)
            archiver.send_signal(signal.SIGKILL)
            archiver.wait()
            newest = manifests.latest(store)
            assert newest is not None
            assert newest.end_offset >= (ends[-1] if ends else 0)  # nothing archived lost
            ends.append(newest.end_offset)
            for segment in newest.segments:
                for ref in segment.objects:
                    assert store.head(ref.key) is not None, ref.key
        archiver = _run_archiver(source, s3_url, out)  # a last one, stopped cleanly
        log.flush()
        end = log.end_offset
        caught_up(store, end, archiver)
        archiver.send_signal(signal.SIGTERM)
        assert archiver.wait(timeout=60) == 0
    log.close()
    assert ends, (tmp_path / "archiver.out").read_text()
    assert verify(store).ok
    restore(store, str(tmp_path / "restored"))
    assert state_of(tmp_path / "restored") == model.state(end)


def push_until_it_succeeds(archiver: Archiver, seconds: float = 60.0):
    """Rounds until one commits, as ``archive run`` does at each tick: a server that has
    just restarted may answer 5xx for a while (its volume servers still registering) after
    its listing already works, and a failed round commits nothing."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return archiver.push()
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_the_s3_server_restarted_mid_run(tmp_path, seaweed, s3_url):
    rng = random.Random(41)
    source = tmp_path / "source"
    log = new_log(source)
    reader = compactlog.open(source, read_only=True)
    store = open_store(s3_url)
    archiver = Archiver(reader, store)
    archiver.start()
    model = Model()
    model.append(log, rng, 200)
    archiver.push()
    seaweed.stop()
    model.append(log, rng, 200)
    with pytest.raises(StoreError):
        archiver.push()  # fails cleanly: nothing committed
    seaweed.start()
    final = push_until_it_succeeds(archiver)
    archiver.stop()
    reader.close()
    assert final.end_offset == log.end_offset
    log.close()
    assert verify(store).ok
    restore(store, str(tmp_path / "restored"))
    assert state_of(tmp_path / "restored") == model.state()


def test_a_proxy_that_drops_delays_and_resets_connections(tmp_path, seaweed, s3_url, monkeypatch):
    """Network faults between the archiver and the server (a loopback TCP proxy): rounds
    fail or get through (obstore retries), never commit a manifest naming a missing object,
    and the archive ends equal to the log."""
    from .proxy import FaultyProxy

    port = int(seaweed.endpoint.rsplit(":", 1)[1])
    proxy = FaultyProxy(("127.0.0.1", port), seed=81, fault_rate=0.05)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    rng = random.Random(82)
    source = tmp_path / "source"
    log = new_log(source)
    reader = compactlog.open(source, read_only=True)
    flaky = open_store(s3_url)
    try:
        archiver = started(Archiver(reader, flaky))
        model = Model()
        failures = sum(faulty_round(log, archiver, model, rng, r) for r in range(10))
        proxy.fault_rate = 0.0
        final = archiver.push()
        archiver.stop()
        assert final.end_offset == log.end_offset
        assert proxy.faults > 0, failures
    finally:
        reader.close()
        log.close()
        proxy.close()
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed.endpoint)
    direct = open_store(s3_url)
    assert verify(direct).ok
    restore(direct, str(tmp_path / "restored"))
    assert state_of(tmp_path / "restored") == model.state()
