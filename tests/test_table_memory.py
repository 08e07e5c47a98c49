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
