"""Tables: restore as of the end offset, reads at one offset, following other processes,
change callbacks, rebuilds after retention, partitioned directories, ``latest(as_of)``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

import compactlog
from compactlog.engine.latest import latest_dict
from compactlog.errors import ConfigError, InexactReadError, LogClosedError
from compactlog.storage import filenames
from compactlog.storage.segment import new_segment_bytes
from compactlog.storage.state_files import read_cleaner_state
from compactlog.table.table import Table, TableError
from compactlog.table.table_memory import TableFullError

CHILD = os.path.join(os.path.dirname(__file__), "children", "table_writer.py")
SMALL = {"segment_bytes": 1024, "index_interval_bytes": 128}


class Writer:
    """A writer in another process (``children/table_writer.py``)."""

    def __init__(self, directory: str, **config: object) -> None:
        self.process = subprocess.Popen(
            [sys.executable, CHILD, directory, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._answer() == "ready"

    def _answer(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        assert line, "the writer process died"
        return line

    def send(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._answer()

    def append(self, key: bytes, value: bytes | None) -> int:
        return int(self.send(f"append {key.hex()} {'-' if value is None else 'v' + value.hex()}"))

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0


@pytest.fixture
def writer(tmp_path):
    made: list[Writer] = []

    def make(directory, **config) -> Writer:
        made.append(Writer(str(directory), **config))
        return made[-1]

    yield make
    for w in made:
        w.close()


def test_restore_gives_the_latest_value_of_every_key_and_reads_in_key_order(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"b", b"1"), (b"a", b"1"), (b"c", b"1"), (b"b", b"2")])
        log.append(b"c", None)
        log.append(b"ab", b"3")
        with log.table(follow=False) as table:
            assert table.offset == log.end_offset == 6
            assert dict(table) == {b"a": b"1", b"ab": b"3", b"b": b"2"}
            assert table[b"b"] == b"2" and table.get(b"c") is None and b"c" not in table
            with pytest.raises(KeyError):
                table[b"c"]
            assert len(table) == 3
            assert list(table) == [b"a", b"ab", b"b"]
            assert list(table.items(b"ab", b"b")) == [(b"ab", b"3")]
            assert list(table.items(prefix=b"a")) == [(b"a", b"1"), (b"ab", b"3")]
            assert list(table.keys(start=b"aa")) == [b"ab", b"b"]
            assert table == latest_dict(log)


def test_deserializers_apply_to_keys_and_values(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"x", b"1"), (b"y", b"2"), (b"x", b"3")])
        with Table(log.path, key_deserializer=bytes.decode, value_deserializer=int) as table:
            assert dict(table) == {"x": 3, "y": 2}
            assert list(table.items(prefix="y")) == [("y", 2)]


def test_max_bytes_refuses_more_and_names_the_disk_store(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"k%d" % i, b"v" * 100) for i in range(100)])
        with pytest.raises(TableFullError, match="store='disk'"):
            Table(log.path, max_bytes=5000)
        with Table(log.path, max_bytes=1 << 20) as table:
            assert len(table) == 100


def test_restore_targets_the_end_offset_when_the_last_records_were_compacted_away(tmp_path):
    """quixstreams #1017: the end offset is 2 but no record is left (a writer died between
    rolling and writing, then the cleaner removed the record and its tombstone); waiting
    for offset 1 must not hang, and the table follows new appends from 2 on."""
    directory = tmp_path / "log"
    with compactlog.open(directory, delete_retention_ms=0, **SMALL) as log:
        log.append(b"k", b"v" * 600)
        log.append(b"k", None)
    (directory / filenames.segment_name(2)).write_bytes(new_segment_bytes())  # the roll
    with compactlog.open(directory) as log:
        log.compact(force=True)
        log.compact(force=True)  # the second pass drops the tombstone the first one saw
        assert list(log.read()) == [] and log.end_offset == 2
        with log.table() as table:
            assert table.offset == 2 and len(table) == 0
            table.wait_for(1, timeout=5)
            offset = log.append(b"n", b"1")
            table.wait_for(offset, timeout=5)
            assert dict(table) == {b"n": b"1"}


def test_restore_targets_the_end_offset_when_retention_expired_every_record(tmp_path):
    directory = tmp_path / "log"
    with compactlog.open(directory, cleanup_policy="delete", **SMALL) as log:
        log.append_batch([(b"k%d" % i, b"v" * 50) for i in range(40)])
    (directory / filenames.segment_name(40)).write_bytes(new_segment_bytes())  # the roll
    with compactlog.open(directory) as log:
        log.enforce_retention(now_ms=1 << 50)
        assert list(log.read()) == [] and log.end_offset == 40
        with log.table(follow=False) as table:
            assert table.offset == 40 and len(table) == 0
            table.wait_for(39, timeout=1)


def test_latest_as_of_below_the_cleaner_point_is_refused_naming_the_lowest_exact_offset(
    tmp_path,
):
    with compactlog.open(tmp_path / "log", **SMALL) as log:
        for i in range(30):
            log.append(b"k%d" % (i % 3), b"v%d" % i + b"x" * 100)
        log.append(b"roll", b"x" * 1000)  # rolls: what came before is in closed segments
        log.compact(force=True)
        point = read_cleaner_state(log.path).first_dirty_offset
        assert point == 30
        with pytest.raises(InexactReadError, match=f"lowest offset with an exact state is {point}"):
            log.latest(as_of=10)
        with pytest.raises(InexactReadError):
            log.latest_batches(as_of=29)
        inexact = {r.key: r.value for r in log.latest(as_of=29, allow_inexact=True)}
        assert inexact == {b"k0": b"v27" + b"x" * 100, b"k1": b"v28" + b"x" * 100}
        assert len(list(log.latest(as_of=30))) == 3


def test_follows_appends_of_another_process_with_changes_in_offset_order(tmp_path, writer):
    directory = tmp_path / "log"
    compactlog.open(directory).close()
    w = writer(directory)
    with Table(directory) as table:
        changes = []
        table.on_change(lambda *change: changes.append(change))
        first = w.append(b"a", b"1")
        second = w.append(b"a", b"2")
        third = w.append(b"a", None)
        w.append(b"gone", None)  # removes nothing: no change
        last = w.append(b"b", b"1")
        table.wait_for(last, timeout=10)
        assert changes == [
            (b"a", None, b"1", first),
            (b"a", b"1", b"2", second),
            (b"a", b"2", None, third),
            (b"b", None, b"1", last),
        ]
        assert dict(table) == {b"b": b"1"}


def test_a_failing_callback_is_raised_by_the_next_read_and_the_follower_goes_on(tmp_path):
    with compactlog.open(tmp_path / "log") as log, log.table() as table:

        @table.on_change
        def fail(key, old, new, offset):
            if key == b"bad":
                raise RuntimeError("callback bug")

        offset = log.append(b"bad", b"1")
        with pytest.raises(TableError) as raised:
            table.wait_for(offset, timeout=5)  # a read: it raises the callback's error
        assert isinstance(raised.value.__cause__, RuntimeError)
        assert table.error is None  # raised once
        table.wait_for(offset, timeout=5)
        log.append(b"bad", b"2")
        while table.error is None:  # (the follower keeps it until a read)
            threading.Event().wait(0.001)
        assert isinstance(table.error, RuntimeError)
        with pytest.raises(TableError):
            len(table)
        table.wait_for(log.append(b"good", b"1"), timeout=5)
        assert dict(table) == {b"bad": b"2", b"good": b"1"}


def test_follow_false_changes_only_on_refresh(tmp_path):
    with compactlog.open(tmp_path / "log") as log, log.table(follow=False) as table:
        log.append(b"a", b"1")
        assert len(table) == 0 and table.offset == 0
        table.refresh()
        assert dict(table) == {b"a": b"1"} and table.offset == 1
        offset = log.append(b"b", b"1")
        table.wait_for(offset, timeout=5)  # refreshes while it waits
        assert len(table) == 2
        with pytest.raises(TimeoutError):
            table.wait_for(offset + 1, timeout=0.05)


def test_a_table_below_the_log_start_restores_again_and_says_so(tmp_path, caplog):
    with compactlog.open(tmp_path / "log", cleanup_policy="compact,delete", **SMALL) as log:
        log.append(b"old", b"1")
        with log.table(follow=False) as table:
            log.append_batch([(b"k%d" % i, b"v" * 60) for i in range(40)])
            log.append(b"roll", b"x" * 1000)  # rolls: what came before is in closed segments
            log.append(b"new", b"1")
            log.enforce_retention(now_ms=1 << 50)
            table.refresh()
            assert table.rebuilds == 1
            assert "restoring that log again" in caplog.text
            assert dict(table) == latest_dict(log) == {b"new": b"1"}


def test_a_partitioned_directory_is_one_table(tmp_path):
    root = tmp_path / "table"
    logs = [compactlog.open(root / f"partition-{n}") for n in range(3)]
    try:
        for n, log in enumerate(logs):
            log.append_batch([(b"p%d-%d" % (n, i), b"%d" % n) for i in range(5)])
        with Table(root) as table:
            assert table.partitioned and len(table) == 15
            assert list(table) == sorted(table)
            assert table[b"p2-4"] == b"2"
            assert list(table.items(prefix=b"p1-")) == [(b"p1-%d" % i, b"1") for i in range(5)]
            offset = logs[1].append(b"p1-new", b"x")
            table.wait_for(offset, timeout=5, partition=1)
            assert table[b"p1-new"] == b"x"
            assert table.offsets == {0: 5, 1: 6, 2: 5}
            with pytest.raises(ConfigError, match="offsets"):
                _ = table.offset
            with pytest.raises(ConfigError, match="partition="):
                table.wait_for(0)
    finally:
        for log in logs:
            log.close()


def test_iteration_during_heavy_following_never_raises_nor_mixes_states(tmp_path, writer):
    """Another process appends pairs ``a=i, b=i`` in one batch each: any one state has
    ``a == b`` or ``a == b + 1`` (a poll may end between the two records)."""
    directory = tmp_path / "log"
    compactlog.open(directory).close()
    w = writer(directory)
    w.send("pairs 1")
    with Table(directory) as table:
        done = threading.Event()
        answers: list[str] = []
        thread = threading.Thread(target=lambda: (answers.append(w.send("pairs 3000")), done.set()))
        thread.start()
        states = 0
        while not done.is_set() or states < 10:
            pairs = dict(table.items())
            assert list(pairs) == sorted(pairs)
            a, b = int(pairs[b"a"]), int(pairs[b"b"])
            assert a in (b, b + 1)
            states += 1
        thread.join()
        table.wait_for(int(answers[0]), timeout=10)
        assert dict(table) == {b"a": b"2999", b"b": b"2999"}


def test_reads_after_close_raise(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        table = log.table()
        table.close()
        with pytest.raises(LogClosedError):
            len(table)


def test_close_wakes_a_waiter(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        table = log.table()
        raised = []

        def wait():
            try:
                table.wait_for(10)
            except LogClosedError as error:
                raised.append(error)

        waiter = threading.Thread(target=wait)
        waiter.start()
        while not table._moved._waiters:  # (the waiter is asleep)
            threading.Event().wait(0.001)
        table.close()
        waiter.join(timeout=10)
        assert raised and not waiter.is_alive()


def test_a_cleaning_pass_and_retention_during_the_restore_change_nothing(tmp_path, writer):
    """Another process compacts and applies retention while the table restores (from the
    first restored batch on): the table still equals the log's latest state."""
    directory = tmp_path / "log"
    config = {"cleanup_policy": "compact,delete", "delete_retention_ms": 0, **SMALL}
    w = writer(directory, **config)
    for i in range(300):
        w.append(b"k%d" % (i % 40), b"v%d" % i + b"x" * 40)
        if i % 9 == 0:
            w.append(b"k%d" % (i % 40), None)
    done = []

    def meanwhile(progress):
        if not done:
            done.append(w.send("compact") + w.send("retain"))

    with Table(directory, follow=False, progress=meanwhile) as table:
        assert done == ["okok"]
        with compactlog.open(directory, read_only=True) as log:
            assert table.offset == log.end_offset
            assert dict(table) == latest_dict(log)


def test_restore_logs_its_progress(tmp_path, caplog, monkeypatch):
    import logging

    from compactlog.table import table_part as table_module

    monkeypatch.setattr(table_module, "PROGRESS_EVERY_S", 0.0)
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"k%d" % i, b"v") for i in range(20_000)])
        with caplog.at_level(logging.INFO, logger="compactlog.table"):
            Table(log.path, follow=False).close()
    assert "restored 20k of 20k records" in caplog.text


def test_restore_logs_when_it_ends_and_when_the_dict_is_built(tmp_path, caplog):
    """However short the restore (no 5 s line), its end and the frozen state's dict are
    each a line naming the log, the offset or the keys, and the time taken."""
    import logging

    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"k%d" % (i % 500), b"v") for i in range(2000)])
        level = caplog.at_level(logging.INFO, logger="compactlog.table")
        with level, Table(log.path, follow=False) as table:
            table._parts[0].thaw()
    assert f"{log.path}: restored to offset 2000 (500 keys), " in caplog.text
    assert "the restored state's dict is built (500 keys), " in caplog.text


def test_a_table_reads_the_declared_formats_and_waits_in_asyncio(tmp_path):
    import asyncio

    path = tmp_path / "users"
    with compactlog.open(path, key_format="str", value_format="json") as log:
        log.append("user:1", {"name": "Ada"})
        table = compactlog.Table(path)
        try:
            assert table["user:1"] == {"name": "Ada"}
            offset = log.append("user:2", {"name": "Bo"})

            async def wait() -> None:
                await table.wait_for_async(offset, timeout=30)

            asyncio.run(wait())
            assert dict(table.items()) == {"user:1": {"name": "Ada"}, "user:2": {"name": "Bo"}}
        finally:
            table.close()
    with compactlog.Table(path, raw=True, follow=False) as raw:
        assert raw[b"user:1"] == b'{"name":"Ada"}'


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_a_key_of_the_wrong_type_is_a_key_error_that_names_the_key_format(tmp_path, store):
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"k", b"v")
        state = {"state_dir": tmp_path / "state"} if store == "disk" else {}
        with log.table(store=store, follow=False, **state) as table:
            assert table[b"k"] == b"v"
            with pytest.raises(KeyError) as found:
                table["k"]
            message = str(found.value)
            assert "str" in message and "key_format='bytes'" in message, message
            assert "b'k'" in message, message  # how to look it up
            assert table.get("k") is None  # still a KeyError: get() and `in` work as a Mapping's
            with pytest.raises(KeyError) as found:
                table[b"absent"]
            assert found.value.args == (b"absent",)  # a key of the right type: the key alone
