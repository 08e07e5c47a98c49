"""A hypothesis state machine: appends, compactions, pushes, prunes and restores against a
latest-per-key model. Mostly on memory:// (fast); a shorter run on SeaweedFS."""

from __future__ import annotations

import random
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from compactlog.archive import manifest as manifests
from compactlog.archive import open_store
from compactlog.archive.prune import prune
from compactlog.archive.restore import restore
from compactlog.archive.verify import verify

from .helpers import ArchivedSource, Model, records_of, state_of
from .seaweed import BUCKET


class ArchiveMachine(RuleBasedStateMachine):
    url_prefix = "memory://"

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="archive-machine-"))
        self.url = f"{self.url_prefix}{uuid.uuid4().hex[:12]}"
        self.store = open_store(self.url)
        self.source = ArchivedSource(self.root / "source", self.store)
        self.log, self.archiver = self.source.log, self.source.archiver
        self.model = Model()
        self.committed: dict[int, tuple[int, list]] = {}  # sequence -> (end, records)
        self.restores = 0

    @rule(count=st.sampled_from([1, 5, 40, 150]), seed=st.integers(0, 2**16))
    def append(self, count, seed):
        self.model.append(self.log, random.Random(seed), count, keys=25)

    @rule()
    def compact(self):
        self.log.compact(force=True)

    @rule()
    def compact_and_push(self):
        self.log.compact(force=True)
        self.push()

    @rule()
    def push(self):
        result = self.archiver.push()
        if result.manifest is not None:
            end = result.manifest.end_offset
            self.committed[result.manifest.sequence] = (end, records_of(self.root / "source", end))
        assert result.end_offset == self.log.end_offset  # sync="always": all durable

    @rule(retention=st.sampled_from([0, 10**9]))
    def prune(self, retention):
        prune(self.store, retention, orphan_grace_ms=0)

    @precondition(lambda self: self.committed)
    @rule()
    def restore_newest(self):
        sequence = manifests.sequences(self.store)[-1]
        end, records = self.committed[sequence]
        target = self.root / f"restore-{self.restores}"
        self.restores += 1
        result = restore(self.store, str(target))
        assert result.sequence == sequence
        assert records_of(target) == records
        assert state_of(target) == self.model.state(end)
        shutil.rmtree(target)

    @precondition(lambda self: self.committed)
    @rule(data=st.data())
    def restore_as_of(self, data):
        retained = manifests.sequences(self.store)
        sequence = data.draw(st.sampled_from(retained))
        end, _records = self.committed[sequence]
        target = self.root / f"restore-{self.restores}"
        self.restores += 1
        result = restore(self.store, str(target), as_of_offset=end)
        assert result.end_offset == end
        assert state_of(target) == self.model.state(end)
        shutil.rmtree(target)

    @invariant()
    def newest_names_only_present_objects(self):
        newest = manifests.latest(self.store)
        if newest is not None:
            present = {i.key for i in self.store.list(manifests.OBJECT_PREFIX)}
            assert newest.object_keys() <= present

    def teardown(self):
        try:
            report = verify(self.store)
            if manifests.latest(self.store) is None:  # nothing pushed: an empty archive is named
                assert report.problems
                assert all("no manifest" in problem for problem in report.problems)
            else:
                assert report.ok, report.problems
        finally:
            self.source.close()
            shutil.rmtree(self.root, ignore_errors=True)


TestArchiveMachine = ArchiveMachine.TestCase
TestArchiveMachine.settings = settings(
    max_examples=8,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class SeaweedArchiveMachine(ArchiveMachine):
    url_prefix = f"s3://{BUCKET}/machine-"


@pytest.mark.usefixtures("seaweed")
class TestSeaweedArchiveMachine(SeaweedArchiveMachine.TestCase):
    settings = settings(
        max_examples=2,
        stateful_step_count=10,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
