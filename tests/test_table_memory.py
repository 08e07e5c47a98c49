"""The memory store's ordered reads: a range or a prefix found by bisection equals the
keys a scan of the sorted keys selects (``\\xff`` and the largest code point included),
and the frozen limit is exact."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactlog.errors import ConfigError
from compactlog.table.table_memory import MemoryStore, prefix_end

BYTES = st.lists(st.sampled_from([b"\x00", b"a", b"b", b"\xfe", b"\xff"]), max_size=4).map(b"".join)
TEXT = st.text(alphabet=["a", "b", chr(sys.maxunicode), "\x00"], max_size=4)


def _store(keys) -> MemoryStore:
    store = MemoryStore()
    store.restored = None  # (a plain dict store)
    store.data = {key: b"v" for key in keys}
    return store


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_key_ranges_equal_a_scan(data):
    alphabet = data.draw(st.sampled_from([BYTES, TEXT]))
    keys = data.draw(st.sets(alphabet, max_size=30))
    store = _store(keys)
    ordered = sorted(keys)
    prefix = data.draw(alphabet)
    assert store.key_range(None, None, prefix) == [k for k in ordered if k.startswith(prefix)]
    start, stop = data.draw(st.none() | alphabet), data.draw(st.none() | alphabet)
    assert store.key_range(start, stop, None) == [
        k for k in ordered if (start is None or k >= start) and (stop is None or k < stop)
    ]
    limit = data.draw(st.integers(0, 5))
    selected = [k for k in ordered if k.startswith(prefix)]
    want = None if len(selected) > limit else selected
    assert store.key_range(None, None, prefix, limit) == want


def test_prefix_end():
    assert prefix_end(b"ab") == b"ac"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"\xff") is None and prefix_end(b"") is None
    assert prefix_end("a" + chr(sys.maxunicode)) == "b"
    with pytest.raises(ConfigError, match="bytes or str"):
        prefix_end(3)  # type: ignore[arg-type]


class _Batch:
    """The columns of a record batch that :meth:`MemoryStore.prepare` reads."""

    def __init__(self, records: list[tuple[bytes | None, bytes | None]], base: int) -> None:
        import numpy as np

        self._keys = [key for key, _value in records]
        self._values = [value for _key, value in records]
        self.key_lengths = np.array([-1 if k is None else len(k) for k in self._keys], np.int64)
        self.value_lengths = np.array([-1 if v is None else len(v) for v in self._values], np.int64)
        self.offsets = np.arange(base, base + len(records), dtype=np.int64)

    def keys(self) -> list[bytes | None]:
        return list(self._keys)

    def values(self) -> list[bytes | None]:
        return list(self._values)


RECORD = st.tuples(
    st.none() | st.sampled_from([b"a", b"b", b"c", b"d"]), st.none() | st.binary(max_size=3)
)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_prepare_then_publish_equals_applying_record_by_record(data):
    """Whatever the options (deserializers, a size bound, a key order, change events),
    a poll's batches prepared then published give the state, the changes and the sizes
    of applying each record in turn; the key order, folded in random steps, catches up."""
    decode = data.draw(st.booleans())
    store = MemoryStore(
        bytes.decode if decode else None,
        (lambda v: v + b"!") if data.draw(st.booleans()) else None,
        data.draw(st.none() | st.just(10**9)),
    )
    store.restored = None  # (a plain dict store)
    if data.draw(st.booleans()):
        store.sorted_keys()
    model: dict = {}
    offset = 0
    for _poll in range(data.draw(st.integers(1, 4))):
        batches = []
        for _ in range(data.draw(st.integers(1, 3))):
            records = data.draw(st.lists(RECORD, max_size=8))
            batches.append(_Batch(records, offset))
            offset += len(records)
        want_changes = []
        for batch in batches:
            for key, value, at in zip(
                batch.keys(), batch.values(), batch.offsets.tolist(), strict=True
            ):
                if key is None:
                    continue
                key = key.decode() if decode else key
                new = (
                    None
                    if value is None
                    else store.value_deserializer(value)
                    if store.value_deserializer
                    else value
                )
                old = model.get(key)
                if value is None:
                    model.pop(key, None)
                else:
                    model[key] = new
                if old is not None or value is not None:
                    want_changes.append((key, old, new, at))
        changes: list | None = [] if data.draw(st.booleans()) else None
        store.publish(store.prepare(batches, changes))
        if changes is not None:
            assert changes == want_changes
        assert store.data == model
        while True:  # each step folds at most ``step`` keys
            step = data.draw(st.integers(1, 5))
            left = sum(len(added) + len(removed) for added, removed in store._unordered)
            if store.fold_order(step):
                assert left <= step
                break
            assert left > step
        store._check()
