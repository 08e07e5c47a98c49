"""A hypothesis state machine: another process appends, tombstones, compacts and applies
retention while a :class:`~compactlog.Table` follows; at every ``wait_for`` the table
equals the latest value of every key appended (or, after the table restored again because
retention removed records it had not applied, the log's latest state), and a table
restored at that moment equals the log's latest state."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

import compactlog
from compactlog.engine.invariants import check
from compactlog.engine.latest import latest_dict

from .test_table import Writer

KEYS = st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"])
VALUES = st.binary(max_size=300)
CONFIG = {
    "cleanup_policy": "compact,delete",
    "segment_bytes": 1024,
    "index_interval_bytes": 128,
    "delete_retention_ms": 0,
}


class TableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="compactlog-table-sm-")
        self.directory = f"{self.root}/log"
        compactlog.open(self.directory, **CONFIG).close()
        self.writer = Writer(self.directory)
        self.table = compactlog.Table(self.directory)
        self.model: dict[bytes, bytes] = {}
        self.last = -1
        self.rebuilds = 0
        self.keys_seen: set[bytes] = set()

    def teardown(self) -> None:
        self.table.close()
        self.writer.close()
        check(self.directory, deep=True)
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(key=KEYS, value=VALUES)
    def append(self, key, value):
        self.keys_seen.add(key)
        self.last = self.writer.append(key, value)
        self.model[key] = value

    @rule(key=KEYS)
    def tombstone(self, key):
        self.last = self.writer.append(key, None)
        self.model.pop(key, None)

    @rule()
    def compact(self):
        assert self.writer.send("compact") == "ok"

    @rule()
    def retention(self):
        assert self.writer.send("retain") == "ok"

    @precondition(lambda self: self.last >= 0)
    @rule()
    def wait_and_compare(self):
        self.table.wait_for(self.last, timeout=30)
        with compactlog.open(self.directory, read_only=True) as log:
            latest = latest_dict(log)
        if self.table.rebuilds != self.rebuilds:
            self.rebuilds = self.table.rebuilds
            self.model = latest
        assert dict(self.table) == self.model
        assert self.table.offset == self.last + 1
        with compactlog.Table(self.directory, follow=False) as restored:
            # point reads first: served frozen unless the dict is built already
            assert len(restored) == len(latest)
            assert all(restored[key] == value for key, value in latest.items())
            assert all(key not in restored for key in self.keys_seen - latest.keys())
            assert dict(restored) == latest


TestTableMachine = TableMachine.TestCase
TestTableMachine.settings = settings(
    max_examples=12,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
