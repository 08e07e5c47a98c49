"""A memory table's restored state served frozen (``table_frozen.py``) until its dict is
built: point reads equal a dict model, also when digests collide; ``key_digest_hi`` is
``key_digests``' lane for any key; the table answers reads while frozen, builds its dict in
the background, and closes at any moment of that."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.encoding.offset_map import key_digest_hi, key_digests
from compactlog.errors import InexactReadError
from compactlog.log import Log
from compactlog.table import table_frozen, table_memory
from compactlog.table.table_frozen import FrozenState

KEYS = st.binary(max_size=80)  # past 64 bytes: the blake2b digests


@settings(max_examples=200, deadline=None)
@given(st.lists(KEYS, max_size=20))
def test_key_digest_hi_is_key_digests_hi_lane(keys):
    lengths = np.array([len(key) for key in keys], np.int64)
    hi, _lo = key_digests(b"".join(keys), lengths)
    assert [key_digest_hi(key) for key in keys] == hi.tolist()


def _frozen(directory: str) -> FrozenState:
    with compactlog.open(directory, read_only=True) as log:
        return FrozenState(list(log.latest_batches()))


def _write(directory: str, writes: list[tuple[bytes, bytes | None]], batch: int) -> dict:
    """Append ``writes`` in batches of ``batch`` (and compact once midway); the model."""
    model: dict[bytes, bytes] = {}
    with compactlog.open(directory, segment_bytes=2048, min_compaction_lag_ms=0) as log:
        for start in range(0, len(writes), batch):
            log.append_batch(writes[start : start + batch])
            if start <= len(writes) // 2 < start + batch:  # the batch holding the middle
                log.compact(force=True)
        for key, value in writes:
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
    return model


WRITES = st.lists(
    st.tuples(
        st.sampled_from([b"", b"a", b"a\0", b"k" * 64, b"k" * 65, b"long" * 30])
        | st.binary(min_size=1, max_size=20),
        st.none() | st.binary(max_size=50),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(writes=WRITES, batch=st.sampled_from([1, 3, 1000]), absent=st.lists(KEYS, max_size=5))
def test_frozen_state_answers_as_the_latest_state(tmp_path_factory, writes, batch, absent):
    directory = str(tmp_path_factory.mktemp("frozen") / "log")
    model = _write(directory, writes, batch)
    frozen = _frozen(directory)
    frozen._check()
    assert len(frozen) == len(model)
    assert sorted(frozen) == sorted(model)
    for key, value in model.items():
        assert frozen[key] == value and key in frozen and frozen.get(key) == value
        assert frozen.get(memoryview(key)) == value  # as a dict of bytes keys answers it
    for key in absent:
        if key not in model:
            assert key not in frozen and frozen.get(key, "no") == "no"
            with pytest.raises(KeyError):
                frozen[key]
    assert frozen.to_dict() == model
    assert list(frozen.to_dict() or {}) == list(frozen)  # keys in log order


def test_keys_whose_digests_collide_are_told_apart_by_their_bytes(tmp_path, monkeypatch):
    directory = str(tmp_path / "log")
    model = _write(directory, [(b"k%d" % i, b"v%d" % i) for i in range(300)], 7)
    # every key gets digest 0: one run of 300 equal digests
    monkeypatch.setattr(table_frozen, "key_digest_hi", lambda key: 0)
    monkeypatch.setattr(
        table_frozen, "key_digests", lambda blob, lengths: (np.zeros(len(lengths), np.uint64),)
    )
    frozen = _frozen(directory)
    assert all(frozen[key] == value for key, value in model.items())
    assert b"k300" not in frozen and b"" not in frozen


def test_unhashable_and_other_keys_behave_as_with_a_dict(tmp_path):
    directory = str(tmp_path / "log")
    _write(directory, [(b"a", b"1")], 1)
    frozen = _frozen(directory)
    with pytest.raises(TypeError):
        frozen.get([b"a"])
    assert frozen.get("a") is None and 1 not in frozen


class _Held:
    """Holds every ``FrozenState.to_dict`` until released: the table stays frozen."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.returned: list[object] = []
        real = FrozenState.to_dict

        def held(frozen, stop=lambda: False):
            self.entered.set()
            while not self.release.wait(0.01):
                if stop():
                    self.returned.append(None)
                    return None
            self.returned.append(real(frozen, stop))
            return self.returned[-1]

        monkeypatch.setattr(FrozenState, "to_dict", held)


@pytest.mark.parametrize("follow", [False, True])
def test_a_table_serves_point_reads_frozen_then_thaws(tmp_path, monkeypatch, follow):
    directory = str(tmp_path / "log")
    model = _write(directory, [(b"k%d" % (i % 150), b"v%d" % i) for i in range(400)], 9)
    held = _Held(monkeypatch)
    with compactlog.Table(directory, follow=follow) as table:
        store = table._parts[0].store
        assert held.entered.wait(10)
        assert store.frozen is not None
        assert len(table) == len(model)
        assert all(table[key] == value for key, value in model.items())
        assert b"nope" not in table and table.get(b"nope") is None
        assert dict(table.items()) == model  # a small range: read frozen too
        assert store.frozen is not None
        held.release.set()
        table._parts[0].thaw()  # (waits for the builder)
        assert store.frozen is None and store.data == model
        assert dict(table.items()) == model


def test_a_small_range_is_read_frozen_and_a_large_one_waits_for_the_dict(tmp_path, monkeypatch):
    directory = str(tmp_path / "log")
    model = _write(directory, [(b"k%04d" % (i % 300), b"v%d" % i) for i in range(700)], 9)
    monkeypatch.setattr(table_memory, "FROZEN_RANGE_KEYS", 50)
    held = _Held(monkeypatch)
    with compactlog.Table(directory, follow=False) as table:
        assert held.entered.wait(10)
        expected = sorted(model.items())
        small = [(k, v) for k, v in expected if k.startswith(b"k002")]
        assert list(table.items(prefix=b"k002")) == small  # 10 keys, frozen
        assert list(table.items(b"k0100", b"k0140")) == [
            (k, v) for k, v in expected if b"k0100" <= k < b"k0140"
        ]
        assert table._parts[0].store.frozen is not None and held.returned == []
        # 100 keys: over the limit, so it waits for the dict (released from another thread)
        threading.Timer(0.2, held.release.set).start()
        assert list(table.items(prefix=b"k01")) == [
            (k, v) for k, v in expected if k.startswith(b"k01")
        ]
        assert table._parts[0].store.frozen is None and held.returned == [model]
        assert list(table.items()) == expected  # the order built while frozen still holds


def test_iterating_every_key_of_a_large_frozen_state_waits_without_sorting_it(
    tmp_path, monkeypatch
):
    directory = str(tmp_path / "log")
    model = _write(directory, [(b"k%d" % i, b"v") for i in range(100)], 9)
    monkeypatch.setattr(table_memory, "FROZEN_RANGE_KEYS", 50)
    sorted_while = []
    key_range = table_memory.MemoryStore.key_range

    def spy(store, *args):
        sorted_while.append("frozen" if store.frozen is not None else "dict")
        return key_range(store, *args)

    monkeypatch.setattr(table_memory.MemoryStore, "key_range", spy)
    held = _Held(monkeypatch)
    with compactlog.Table(directory, follow=False) as table:
        assert held.entered.wait(10)
        threading.Timer(0.2, held.release.set).start()
        assert dict(table) == model
    assert sorted_while == ["dict"]


def test_follower_applies_appends_after_the_dict_is_built(tmp_path, monkeypatch):
    directory = str(tmp_path / "log")
    model = _write(directory, [(b"k%d" % i, b"v") for i in range(50)], 10)
    held = _Held(monkeypatch)
    with compactlog.Table(directory) as table:
        assert held.entered.wait(10)
        with compactlog.open(directory) as log:
            offset = log.append(b"k1", b"new")
            log.append(b"k2", None)
        with pytest.raises(TimeoutError):
            table.wait_for(offset, timeout=0.2)  # nothing is applied to a frozen state
        assert table[b"k1"] == b"v" and b"k2" in table  # the restored state, unchanged
        held.release.set()
        table.wait_for(offset + 1, timeout=10)
        model[b"k1"] = b"new"
        del model[b"k2"]
        assert dict(table) == model


@pytest.mark.parametrize("follow", [False, True])
def test_closing_while_the_dict_is_built(tmp_path, monkeypatch, follow):
    directory = str(tmp_path / "log")
    _write(directory, [(b"k%d" % i, b"v") for i in range(100)], 10)
    held = _Held(monkeypatch)
    table = compactlog.Table(directory, follow=follow)
    assert held.entered.wait(10)
    table.close()  # the builder stops between steps; close joins it
    assert held.returned == [None]
    assert table._parts[0].store.frozen is None  # (its batches released)


def test_restore_reads_again_when_a_cleaning_pass_overtakes_its_end(tmp_path, monkeypatch):
    directory = str(tmp_path / "log")
    model = _write(directory, [(b"k%d" % i, b"v%d" % i) for i in range(20)], 5)
    real = Log.latest_batches
    calls = []

    def overtaken(log, as_of=None, **options):
        calls.append(as_of)
        if len(calls) == 1:
            raise InexactReadError("a pass moved the cleaner point past as_of")
        return real(log, as_of, **options)

    monkeypatch.setattr(Log, "latest_batches", overtaken)
    with compactlog.Table(directory, follow=False) as table:
        assert dict(table) == model
    assert len(calls) == 2


def test_building_the_dict_stops_between_steps(tmp_path, monkeypatch):
    directory = str(tmp_path / "log")
    model = _write(directory, [(b"k%d" % i, b"v" * 500) for i in range(40)], 4)
    frozen = _frozen(directory)
    assert len(frozen.batches) >= 3
    monkeypatch.setattr(table_frozen, "THAW_STEP", 1)  # a step a batch
    asked = []

    def stop():
        asked.append(True)
        return len(asked) == 2

    assert frozen.to_dict(stop) is None and len(asked) == 2
    assert frozen.to_dict() == model


def test_building_the_dict_lets_go_of_each_batch_and_reads_go_on(tmp_path, monkeypatch):
    """Restore memory: a batch whose records are in the dict is dropped (the batches and the
    dict are never both whole); reads of its keys are answered from the dict meanwhile, and
    a build stopped midway goes on from there."""
    directory = str(tmp_path / "log")
    model = _write(directory, [(b"key%d" % i, b"v%d" % i) for i in range(400)], 25)
    monkeypatch.setattr(table_frozen, "THAW_STEP", 50)
    frozen = _frozen(directory)
    steps = iter([False, True])  # one step more, then stop
    assert frozen.to_dict(stop=lambda: next(steps)) is None
    dropped = sum(batch is None for batch in frozen.batches)
    assert 0 < dropped < len(frozen.batches)
    assert {key: frozen[key] for key in model} == model and b"key400" not in frozen
    frozen._check()
    assert frozen.to_dict() == model
    assert all(batch is None for batch in frozen.batches)
    assert {key: frozen.get(key) for key in model} == model
