"""A table over a log holding a value its format cannot decode: format names as
deserializers, and the ``on_decode_error`` policy (raise, naming the log and the offset;
or skip and report), for the memory and the disk store, at restore and while following."""

from __future__ import annotations

import logging

import pytest

import compactlog
from compactlog.errors import ConfigError, DecodeError, TableError
from compactlog.table.table import Table

STORES = [{}, {"store": "disk"}]


def options(store, tmp_path):
    if store:
        pytest.importorskip("lmdb")
        return {"store": "disk", "state_dir": str(tmp_path / "state")}
    return {}


def json_log(path, bad_at=None):
    """A json log of ``a``..``e`` (``{"n": i}``), with ``b"{broken"`` as the value of the
    record at offset ``bad_at`` (its key ``bad``), written raw as another writer could."""
    with compactlog.open(path, key_format="str", value_format="json") as log:
        for i, key in enumerate("abcde"):
            if i == bad_at:
                with compactlog.open(path, raw=True) as raw:
                    raw.append(b"bad", b"{broken")
            log.append(key, {"n": i})


@pytest.mark.parametrize("name, stored, expected", [("json", b"[1]", [1]), ("str", b"x", "x")])
def test_value_deserializer_takes_the_format_names_open_takes(tmp_path, name, stored, expected):
    """Regression: ``Table(value_deserializer="json")`` raised TypeError ('str' object is
    not callable)."""
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"k", stored)
    with Table(tmp_path / "log", value_deserializer=name, follow=False) as table:
        assert table[b"k"] == expected
    with Table(tmp_path / "log", key_deserializer="str", follow=False) as table:
        assert table["k"] == stored
    with pytest.raises(ConfigError, match="value_deserializer"):
        Table(tmp_path / "log", value_deserializer="xml")


@pytest.mark.parametrize("store", STORES, ids=["memory", "disk"])
def test_a_restore_raises_naming_the_log_and_the_offset(tmp_path, store):
    json_log(tmp_path / "log", bad_at=2)
    with pytest.raises(DecodeError) as caught:
        Table(tmp_path / "log", follow=False, **options(store, tmp_path))
    assert caught.value.offset == 2 and caught.value.part == "value"
    assert str(tmp_path / "log") in str(caught.value) and "offset 2" in str(caught.value)


@pytest.mark.parametrize("store", STORES, ids=["memory", "disk"])
def test_skip_leaves_the_record_out_and_reports_it(tmp_path, store, caplog):
    json_log(tmp_path / "log", bad_at=2)
    with (
        caplog.at_level(logging.WARNING, logger="compactlog.table"),
        Table(tmp_path / "log", on_decode_error="skip", **options(store, tmp_path)) as table,
    ):
        key = "bad"  # (a disk table takes the declared key format too)
        assert key not in table and len(table) == 5
        assert table.skipped_count == 1
        assert [(e.offset, e.part, e.format) for e in table.skipped] == [(2, "value", "json")]
        assert "offset 2" in caplog.text and str(tmp_path / "log") in caplog.text


@pytest.mark.parametrize("store", STORES, ids=["memory", "disk"])
@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_a_follower_meeting_an_undecodable_value(tmp_path, store, policy):
    """Regression: the follower stopped for good with a bare JSONDecodeError (no log, no
    offset)."""
    json_log(tmp_path / "log")
    with (
        Table(tmp_path / "log", on_decode_error=policy, **options(store, tmp_path)) as table,
        compactlog.open(tmp_path / "log") as log,
    ):
        changes = []
        table.on_change(lambda key, old, new, offset: changes.append((key, new, offset)))
        first = "a"
        with compactlog.open(tmp_path / "log", raw=True) as raw:
            raw.append_batch([(b"a", b'{"n": 10}'), (b"a", b"{broken"), (b"f", b"[]")])
        last = log.append("g", {"n": 7})
        if policy == "raise":
            with pytest.raises(TableError, match="offset 6") as caught:
                table.wait_for(last, timeout=10)
            cause = caught.value.__cause__
            assert isinstance(cause, DecodeError) and cause.offset == 6
            assert str(tmp_path / "log") in str(caught.value)
            return
        table.wait_for(last, timeout=10)
        assert table[first] == {"n": 10}  # the key keeps the value before the bad record
        assert table.skipped_count == 1 and table.skipped[0].offset == 6
        assert [offset for _k, _new, offset in changes] == [5, 7, 8]


def test_an_unknown_policy_is_refused(tmp_path):
    json_log(tmp_path / "log")
    with pytest.raises(ConfigError, match="on_decode_error"):
        Table(tmp_path / "log", on_decode_error="ignore")
