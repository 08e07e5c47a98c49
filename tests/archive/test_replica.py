"""A replica followed by a ``Table``: a hypothesis state machine in which the source log is
appended to and compacted, the archiver pushes and prunes, the follower applies manifests
(also in the middle of a table's poll, between the end offset it reads and the segments it
reads), and the table keeps up; checked against a latest-per-key model."""

from __future__ import annotations

import random
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import compactlog
from compactlog.archive import follow as follow_module
from compactlog.archive import open_store
from compactlog.archive.follow import Follower
from compactlog.archive.prune import prune
from compactlog.engine import latest
from compactlog.storage.state_files import replica_lock

from ..test_cli import SCRIPT, run
from .helpers import ArchivedSource, Model, new_log, state_of


class _EndThenApply:
    """A subscriber's view of its log whose ``end_offset`` runs ``apply`` once right after
    it is read: the follower applying a manifest in the middle of a table's poll."""

    def __init__(self, log: Any, apply: Any) -> None:
        self._log = log
        self._apply = apply

    @property
    def end_offset(self) -> int:
        end = self._log.end_offset
        apply, self._apply = self._apply, None
        if apply is not None:
            apply()
        return end

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


POLL_PATIENCE_S = 0.5  # how long a poll may take before it is taken to wait for the apply


class SteppedFollower(Follower):
    """A follower that calls ``during()`` after each segment it writes or removes."""

    during: Any = None

    def _write(self, *args: Any) -> None:
        super()._write(*args)
        if self.during is not None:
            self.during()


class ReplicaMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="replica-machine-"))
        self.store = open_store(f"memory://{uuid.uuid4().hex[:12]}")
        self.source = ArchivedSource(self.root / "source", self.store)
        self.log, self.archiver = self.source.log, self.source.archiver
        self.model = Model()
        self.model.append(self.log, random.Random(0), 20, keys=25)
        self.archiver.push()
        self.replica = self.root / "replica"
        self.follower = SteppedFollower(self.store, str(self.replica))
        self.follower.step()
        self.table = compactlog.Table(self.replica, follow=False, raw=True)

    @rule(count=st.sampled_from([1, 5, 40, 150]), seed=st.integers(0, 2**16))
    def append(self, count, seed):
        self.model.append(self.log, random.Random(seed), count, keys=25)

    @rule()
    def compact(self):
        self.log.compact(force=True)

    @rule(seed=st.integers(0, 2**16))
    def append_compact_push(self, seed):
        self.append(40, seed)
        self.compact()
        self.push()

    @rule()
    def push(self):
        self.archiver.push()

    @rule()
    def prune(self):
        prune(self.store, 0, orphan_grace_ms=0)

    @rule()
    def follow(self):
        self.follower.step()

    @rule()
    def table_catches_up(self):
        self.table.refresh()
        assert self.table.offset == self.follower.applied.end_offset
        assert dict(self.table.items()) == self.model.state(self.table.offset)

    @rule()
    def table_polls_while_the_follower_applies(self):
        part = self.table._parts[0]
        subscriber = part.subscriber
        log = subscriber.log
        subscriber.log = _EndThenApply(log, self.follower.step)
        try:
            part.poll(0)
        finally:
            subscriber.log = log

    @rule()
    def table_polls_at_every_step_of_an_apply(self):
        part = self.table._parts[0]
        remove = follow_module._remove
        waiting: list[threading.Thread] = []  # polls that restore: they wait for the apply
        failures: list[BaseException] = []

        def poll() -> None:
            try:
                part.poll(0)
            except BaseException as error:  # (raised here, after the apply)
                failures.append(error)

        def poll_now() -> None:
            # a poll that must restore takes the follower's lock shared, which this thread
            # holds exclusively while it applies: that poll finishes once the apply has
            thread = threading.Thread(target=poll, daemon=True)
            thread.start()
            thread.join(POLL_PATIENCE_S)
            if thread.is_alive():
                waiting.append(thread)

        def removed(path: str) -> None:
            remove(path)
            poll_now()

        self.follower.during = poll_now
        follow_module._remove = removed
        try:
            self.follower.step()
        finally:
            follow_module._remove = remove
            self.follower.during = None
            for thread in waiting:
                thread.join()
        if failures:
            raise failures[0]

    @invariant()
    def the_replica_holds_a_manifest_state(self):
        applied = self.follower.applied
        assert applied is not None
        assert state_of(self.replica) == self.model.state(applied.end_offset)

    @invariant()
    def the_table_reports_no_offset_past_the_replica(self):
        assert self.table.offset <= self.follower.applied.end_offset

    def teardown(self):
        try:
            self.table_catches_up()
        finally:
            self._close()

    def _close(self):
        self.table.close()
        self.source.close()
        shutil.rmtree(self.root, ignore_errors=True)


TestReplicaMachine = ReplicaMachine.TestCase
TestReplicaMachine.settings = settings(
    max_examples=10,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_a_replica_passes_verify_and_repair_refuses_it(tmp_path):
    """``compactlog verify`` checks a replica as a replica (indexes are optional: nothing
    rebuilds them there) and ``compactlog repair`` says what to do instead."""
    url = f"file://{tmp_path}/archive"
    log = new_log(tmp_path / "source", segment_bytes=2048)
    model = Model()
    rng = random.Random(3)
    model.append(log, rng, 100)
    run("archive", "push", tmp_path / "source", url)
    run("archive", "follow", url, tmp_path / "replica", "--once")
    for _ in range(3):
        model.append(log, rng, 100)
        log.compact(force=True)
    log.close()
    run("archive", "push", tmp_path / "source", url)
    run("archive", "follow", url, tmp_path / "replica", "--once")
    assert state_of(tmp_path / "replica") == model.state()
    verified = run("verify", tmp_path / "replica")
    assert "OK" in verified.stdout and "a replica of file://" in verified.stdout
    refused = run("repair", tmp_path / "replica", check=1)
    assert "is a replica of file://" in refused.stderr
    assert "follow again" in refused.stderr and "Traceback" not in refused.stderr


def test_verify_waits_for_the_follower_to_finish_applying(tmp_path):
    """While the follower applies a manifest (holding ``.archive-follow.lock``), a merged
    rewrite may stand beside the segment it replaces: verify waits instead of reporting
    an overlap."""
    url = f"file://{tmp_path}/archive"
    log = new_log(tmp_path / "source", segment_bytes=2048)
    Model().append(log, random.Random(4), 150)
    log.close()
    run("archive", "push", tmp_path / "source", url)
    replica = tmp_path / "replica"
    run("archive", "follow", url, replica, "--once")
    second = sorted(p for p in replica.iterdir() if p.suffix == ".log")[1]
    beside = replica / f"{int(second.stem) + 1:020d}.log"  # overlapping, as mid-apply
    with replica_lock(str(replica)):
        shutil.copy(second, beside)
        verifying = subprocess.Popen(
            [SCRIPT, "verify", str(replica)], stdout=subprocess.PIPE, text=True
        )
        time.sleep(0.5)
        assert verifying.poll() is None  # waiting for the lock
        beside.unlink()
    out, _ = verifying.communicate(timeout=60)
    assert verifying.returncode == 0 and "overlaps" not in out


def test_a_table_restored_while_the_follower_applies_is_exact(monkeypatch):
    """The follower applies a manifest with a cleaning pass's rewrites between the end a
    table's restore reads and the segments it reads: the restore holds the replica lock,
    so the follower waits, and the state at the offset the table reports is exact."""
    machine = ReplicaMachine()
    try:
        rng = random.Random(3)
        machine.model.append(machine.log, rng, 40, keys=25)
        machine.compact()
        machine.push()
        machine.follow()
        machine.model.append(machine.log, rng, 40, keys=25)
        machine.compact()
        machine.push()
        opened = latest._OpenSegments.__init__
        applying = threading.Thread(target=machine.follower.step)

        def open_segments(self, *args, **kwargs):
            monkeypatch.setattr(latest._OpenSegments, "__init__", opened)
            applying.start()
            applying.join(timeout=0.5)  # (it waits for the restore: the replica lock)
            opened(self, *args, **kwargs)

        monkeypatch.setattr(latest._OpenSegments, "__init__", open_segments)
        with compactlog.Table(machine.replica, follow=False, raw=True) as table:
            assert dict(table.items()) == machine.model.state(table.offset)
        applying.join()
    finally:
        machine._close()


def test_a_follower_over_a_damaged_replica_state_says_what_to_do(tmp_path):
    """``.archive-follow.json`` unreadable: the follower refuses naming the file and the way
    out (follow again into a new directory), instead of a bare ``ValueError``."""
    url = f"file://{tmp_path}/archive"
    log = new_log(tmp_path / "source", segment_bytes=2048)
    Model().append(log, random.Random(5), 50)
    log.close()
    run("archive", "push", tmp_path / "source", url)
    run("archive", "follow", url, tmp_path / "replica", "--once")
    (tmp_path / "replica" / ".archive-follow.json").write_bytes(b'{"url": "file://')
    refused = run("archive", "follow", url, tmp_path / "replica", "--once", check=1)
    assert ".archive-follow.json is damaged" in refused.stderr
    assert "follow again" in refused.stderr and "Traceback" not in refused.stderr
