"""Memory and disk tables answer every read the same way, for bytes, str and json keyed
logs (issue 24: a str-keyed disk table missed ``td["user:1"]`` silently)."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.errors import TableError
from compactlog.table.table import Table

_SMALL = st.sampled_from(["", "a", "ab", "b", "user:", "user:1", "é", "\u20ac", "\U0001f600"])
_TEXT = st.one_of(_SMALL, st.text(min_size=1, max_size=6))

_KEYS = {
    "bytes": st.one_of(
        st.sampled_from([b"a", b"ab", b"b", b"user:", b"user:1", b"\xff", b"\x00"]),
        st.binary(min_size=1, max_size=6),
    ),
    "str": _TEXT.filter(bool),
    # one JSON type per log: a memory table sorts its keys, and ints and strs do not compare
    "json": st.one_of(
        st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=12),
        st.lists(_TEXT, min_size=1, max_size=12),
    ),
}


@st.composite
def _writes(draw: Any, key_format: str) -> tuple[list[tuple[Any, bytes | None]], list[Any]]:
    if key_format == "json":
        keys = draw(_KEYS["json"])
    else:
        keys = draw(st.lists(_KEYS[key_format], min_size=1, max_size=12))
    values = st.one_of(st.none(), st.binary(max_size=3))
    writes = draw(st.lists(st.tuples(st.sampled_from(keys), values), min_size=1, max_size=30))
    probes = draw(st.lists(_KEYS[key_format] if key_format != "json" else st.sampled_from(keys)))
    return writes, keys + (probes if key_format != "json" else [])


def _reads(table: Table, keys: list[Any], key_format: str) -> dict[str, Any]:
    """Everything a reader can ask, with the answers (an exception's type as the answer)."""

    def answer(call: Any) -> Any:
        try:
            return call()
        except Exception as error:  # (the same error on both stores)
            return type(error)

    out: dict[str, Any] = {
        "dict": dict(table),
        "len": len(table),
        "items": list(table.items()),
        "keys": list(table.keys()),
        "values": list(table.values()),
        "iter": list(table),
    }
    for key in keys:
        out[f"get {key!r}"] = table.get(key, "absent")
        out[f"in {key!r}"] = key in table
        out[f"[] {key!r}"] = answer(lambda key=key: table[key])
    ordered = sorted(set(keys))
    for start in ordered[:4]:
        for stop in ordered[-3:]:
            out[f"range {start!r} {stop!r}"] = list(table.items(start, stop))
        out[f"from {start!r}"] = list(table.items(start))
        out[f"to {start!r}"] = list(table.items(None, start))
    if key_format != "json" or isinstance(keys[0], str):
        for key in ordered[:6]:
            for cut in (0, 1, 2):
                prefix = key[: max(len(key) - cut, 1)]
                out[f"prefix {prefix!r}"] = list(table.items(prefix=prefix))
    return out


def _write(log: Any, writes: list[tuple[Any, bytes | None]], key_format: str, n: int) -> None:
    for i, (key, value) in enumerate(writes):
        if (i + n) % 4 == 3:
            log.append_batch([(key, value)])
        else:
            log.append(key, value)


@pytest.mark.parametrize("key_format", ["bytes", "str", "json"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_memory_and_disk_tables_answer_alike(key_format: str, data: Any) -> None:
    writes, keys = data.draw(_writes(key_format))
    more, _ = data.draw(_writes(key_format))
    if key_format == "json":
        more = [(k, v) for k, v in more if type(k) is type(writes[0][0])]
    with (
        tempfile.TemporaryDirectory() as root,
        compactlog.open(f"{root}/log", key_format=key_format) as log,
    ):
        _write(log, writes, key_format, 0)
        tables = [
            Table(log.path, follow=False),
            Table(log.path, follow=False, store="disk", state_dir=f"{root}/state"),
        ]
        try:
            changes: list[list[Any]] = [[], []]
            for table, seen in zip(tables, changes, strict=True):
                table.on_change(lambda *change, seen=seen: seen.append(change))
            memory, disk = (_reads(t, keys, key_format) for t in tables)
            assert disk == memory
            _write(log, more, key_format, 1)
            for table in tables:
                table.refresh()
            memory, disk = (_reads(t, keys, key_format) for t in tables)
            assert disk == memory
            assert changes[1] == changes[0]
        finally:
            for table in tables:
                table.close()


def test_a_str_keyed_disk_table_takes_str_keys(tmp_path):
    """The report: ``td["user:1"]`` a KeyError, ``get`` None, ``in`` False, and
    ``items(prefix="user:")`` a raw TypeError."""
    with compactlog.open(tmp_path / "log", key_format="str") as log:
        log.append_batch([("user:1", b"a"), ("user:2", b"b"), ("other", b"c")])
        with log.table(store="disk", state_dir=tmp_path / "state") as td:
            assert td["user:1"] == b"a" and td.get("user:2") == b"b" and "user:1" in td
            assert list(td.items(prefix="user:")) == [("user:1", b"a"), ("user:2", b"b")]
            assert list(td) == ["other", "user:1", "user:2"]
            assert td.get(b"user:1") is None  # (a str table's keys are str, as in memory)


def test_a_key_lmdb_cannot_hold_is_named(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"k" * 600, b"v")
        with pytest.raises(TableError, match=r"offset 0 has 600 bytes.*store='memory'"):
            log.table(store="disk", state_dir=tmp_path / "state")
