"""Serializers (compactlog/serde.py): built-in and custom formats, declared formats that
every reader honours, raw access, and decode errors that name the offset."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.encoding.serde import declared_formats, decodes, deserializers

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=10,
).filter(lambda v: v is not None)  # None is a tombstone, never a JSON null


def test_bytes_is_the_default_and_keeps_the_plain_append_path(log_dir):
    with compactlog.open(log_dir) as log:
        assert (log.config.key_format, log.config.value_format) == ("bytes", "bytes")
        assert log.plain_append_installed
        log.append(b"k", b"v")
        assert [(r.key, r.value) for r in log.read()] == [(b"k", b"v")]


@settings(max_examples=30, deadline=None)
@given(key=st.text(min_size=1), value=JSON_VALUES)
def test_json_values_and_str_keys_round_trip(tmp_path_factory, key, value):
    path = tmp_path_factory.mktemp("log")
    with compactlog.open(path, key_format="str", value_format="json") as log:
        log.append(key, value)
        log.append_batch([(key, value), (key + "2", None)])
        assert [(r.key, r.value) for r in log.read()] == [
            (key, value),
            (key, value),
            (key + "2", None),
        ]


@pytest.mark.parametrize(
    ("fmt", "value", "stored"),
    [
        ("bytes", b"\x00\xff", b"\x00\xff"),
        ("str", "h\u00e9llo", "h\u00e9llo".encode()),
        ("json", {"a": [1, 2.5, "\u00e9"], "b": None}, '{"a":[1,2.5,"\u00e9"],"b":null}'.encode()),
    ],
)
def test_each_built_in_format_stores_its_bytes_and_reads_them_back(log_dir, fmt, value, stored):
    with compactlog.open(log_dir, value_format=fmt) as log:
        log.append(b"k", value)
        log.append(b"gone", None)
        assert [r.value for r in log.read()] == [value, None]
        assert [r.value for r in log.read(raw=True)] == [stored, None]
        assert [r.value for r in log.latest()] == [value]


def test_declared_formats_are_stored_and_honoured_by_a_later_open(log_dir):
    compactlog.open(log_dir, key_format="str", value_format="json").close()
    with compactlog.open(log_dir) as log:
        log.append("user:1", {"name": "Ada"})
    with compactlog.open(log_dir, read_only=True) as log:
        assert [(r.key, r.value) for r in log.read()] == [("user:1", {"name": "Ada"})]
        assert declared_formats(log.config) == {"key_format": "str", "value_format": "json"}


def test_subscribers_poll_deserializes_and_raw_subscriber_does_not(log_dir):
    with compactlog.open(log_dir, value_format="json") as log:
        log.append(b"a", [1])
        decoded = log.subscribe("decoded")
        raw = log.subscribe("raw", raw=True)
        assert [r.value for r in decoded.poll()] == [[1]]
        assert [r.value for r in raw.poll()] == [b"[1]"]


def test_a_custom_pair_of_callables_round_trips(log_dir):
    pack = struct.Struct(">q").pack

    def unpack(data: bytes) -> int:
        return struct.unpack(">q", data)[0]

    with compactlog.open(
        log_dir,
        key_serializer="str",
        key_deserializer="str",
        value_serializer=pack,
        value_deserializer=unpack,
    ) as log:
        assert not log.plain_append_installed
        log.append("n", -5)
        log.append_batch([("m", 2**40)])
        assert [(r.key, r.value) for r in log.read()] == [("n", -5), ("m", 2**40)]
        assert [r.value for r in log.read(raw=True)] == [pack(-5), pack(2**40)]
        # nothing given at open is stored: the log declares no format
        assert log.config.value_format == "bytes"
    with compactlog.open(log_dir, read_only=True) as log:
        assert [r.value for r in log.read()] == [pack(-5), pack(2**40)]


def test_callables_given_at_open_override_the_declared_format(log_dir):
    compactlog.open(log_dir, value_format="json").close()
    with compactlog.open(
        log_dir, value_serializer=str.encode, value_deserializer=bytes.decode
    ) as log:
        log.append(b"k", "not json")
        assert [r.value for r in log.read()] == ["not json"]


def test_raw_open_ignores_declared_formats(log_dir):
    compactlog.open(log_dir, value_format="json").close()
    with compactlog.open(log_dir, raw=True) as log:
        assert log.plain_append_installed
        log.append(b"k", b"[1]")
        assert [r.value for r in log.read()] == [b"[1]"]
        assert [r.value for r in log.subscribe("~s", start=0).poll()] == [b"[1]"]


def test_a_value_that_fails_to_decode_names_its_offset_and_the_log(log_dir):
    with compactlog.open(log_dir, raw=True, value_format="json") as log:
        log.append_batch([(b"a", b"1"), (b"b", b"{broken"), (b"c", b"2")])
    with compactlog.open(log_dir) as log:
        with pytest.raises(compactlog.DecodeError) as caught:
            list(log.read())
        assert caught.value.offset == 1
        assert caught.value.part == "value"
        assert caught.value.format == "json"
        assert "offset 1" in str(caught.value) and str(log_dir) in str(caught.value)
        subscriber = log.subscribe("s")
        for _attempt in range(2):  # the position stays: the same error again
            with pytest.raises(compactlog.DecodeError, match="offset 1"):
                subscriber.poll()
            assert subscriber.position == 0
        subscriber.seek(2)
        assert [r.value for r in subscriber.poll()] == [2]
        assert [r.value for r in log.read(raw=True)] == [b"1", b"{broken", b"2"]


def test_a_key_that_fails_to_decode_names_its_offset(log_dir):
    with compactlog.open(log_dir, raw=True, key_format="str") as log:
        log.append(b"ok", b"")
        log.append(b"\xff", b"")
    with compactlog.open(log_dir) as log, pytest.raises(compactlog.DecodeError) as caught:
        list(log.read())
    assert (caught.value.offset, caught.value.part) == (1, "key")


@pytest.mark.parametrize(
    ("config", "key", "value", "message"),
    [
        ({"value_format": "str"}, b"k", b"bytes", "cannot be serialized as str"),
        ({"value_format": "json"}, b"k", {1, 2}, "cannot be serialized as json"),
        ({"value_format": "json"}, b"k", float("nan"), "cannot be serialized as json"),
        ({"key_format": "str"}, 5, b"v", "key 5 cannot be serialized as str"),
    ],
)
def test_a_value_the_format_cannot_serialize_is_refused_naming_the_format(
    log_dir, config, key, value, message
):
    with compactlog.open(log_dir, **config) as log:
        with pytest.raises(compactlog.InvalidRecordError, match=message):
            log.append(key, value)
        with pytest.raises(compactlog.InvalidRecordError, match=message):
            log.append_batch([(key, value)])
        assert log.end_offset == 0


def test_a_serializer_that_returns_no_bytes_is_refused(log_dir):
    with (
        compactlog.open(log_dir, value_serializer=lambda v: v) as log,
        pytest.raises(compactlog.InvalidRecordError, match="returned int, not bytes"),
    ):
        log.append(b"k", 5)


@pytest.mark.parametrize(
    "arguments",
    [
        {"value_format": "xml"},
        {"key_format": 1},
        {"value_serializer": "xml"},
        {"key_deserializer": 3},
    ],
)
def test_unknown_formats_are_refused_naming_the_setting(log_dir, arguments):
    name = next(iter(arguments))
    with pytest.raises(compactlog.ConfigError, match=name):
        compactlog.open(log_dir, **arguments)


def test_changing_the_declared_format_takes_effect_on_open_logs(log_dir):
    with compactlog.open(log_dir) as log:
        log.append(b"k", b'"v"')
        log.update_meta(config=log.config.merged({"value_format": "json"}))
        assert [r.value for r in log.read()] == ["v"]
        log.append(b"k2", "w")
        assert [r.value for r in log.read(raw=True)] == [b'"v"', b'"w"']


def test_deserializers_gives_plain_callables_for_named_formats():
    key, value = deserializers("str", "json")
    assert key is not None and value is not None
    assert (key(b"k"), value(b"[1]")) == ("k", [1])
    assert deserializers() == (None, None)
    with pytest.raises(compactlog.ConfigError, match="value_format"):
        deserializers("bytes", "yaml")


@pytest.mark.parametrize(
    "name, stored, offset",
    [("value_format", [b"1", b"{broken"], 1), ("key_format", [b"\xff"], 0)],
)
def test_declaring_a_format_checks_the_stored_records(log_dir, name, stored, offset):
    """Regression: ``update_config`` (and ``compactlog config set``) declared json over
    values that are not JSON: every reader of the log then stopped at them."""
    with compactlog.open(log_dir) as log:
        for item in stored:
            log.append(item if name == "key_format" else b"k", item)
        log.append(b"gone", None)  # a tombstone's value is never decoded
    wanted = "json" if name == "value_format" else "str"
    with pytest.raises(compactlog.UnsafeChangeError, match=f"offset {offset}") as caught:
        compactlog.open(log_dir, update_config=True, **{name: wanted})
    assert str(log_dir) in str(caught.value) and f"{name}={wanted!r}" in str(caught.value)
    with compactlog.open(log_dir) as log:
        assert getattr(log.config, name) == "bytes"
        with pytest.raises(compactlog.UnsafeChangeError, match=f"offset {offset}"):
            log.store_config({name: wanted})
        assert log.store_config({name: "bytes"}) == log.config  # (no change: nothing read)


def test_declaring_a_format_the_records_hold_is_stored(log_dir):
    with compactlog.open(log_dir) as log:
        log.append_batch([(b"a", b'{"x": 1}'), (b"b", b"[2]"), (b"c", None)])
    with compactlog.open(log_dir, update_config=True, key_format="str", value_format="json"):
        pass
    with compactlog.open(log_dir) as log:
        assert [(r.key, r.value) for r in log.read()] == [("a", {"x": 1}), ("b", [2]), ("c", None)]


JSONISH = st.one_of(
    st.binary(max_size=12),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda v, a, b: (a + json.dumps(v) + b).encode(),
        JSON_VALUES,
        st.sampled_from(["", " ", "\n", "x", ",1", "]", "{"]),
        st.sampled_from(["", " ", "\t", "x", ",1", "]", "}", "[", '"']),
    ),
)


def loads_all(items):
    try:
        for item in items:
            if item is not None:
                json.loads(item)
    except ValueError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(st.lists(st.none() | JSONISH, max_size=6))
def test_the_fast_json_check_agrees_with_json_loads(items):
    """``serde.decodes`` checks json with the C scanner of the json module: it must accept
    exactly what ``json.loads`` accepts, item by item."""
    assert decodes(json.loads, items) == loads_all(items)
    assert decodes(bytes.decode, items) == all(_utf8(i) for i in items if i is not None)


def _utf8(item):
    try:
        item.decode()
    except UnicodeDecodeError:
        return False
    return True


def _loaded(convert, data):
    """What ``convert(data)`` gives (as JSON text, NaN included) or the error type raised."""
    try:
        return json.dumps(convert(data))
    except Exception as error:
        return type(error)


JSON_EDGES = [
    b"NaN",
    b"[Infinity, -Infinity]",
    b"1e400",
    b"123456789012345678901234567890",
    b"-9223372036854775809",
    b"18446744073709551616",
    b'"\\ud800"',
    b"\xef\xbb\xbf[1]",
    '{"\u00e9": 1}'.encode("utf-16"),
    '["x"]'.encode("utf-32"),
    b'"\xff"',
    b" {} ",
    b"[1,]",
    b"",
    b"{broken",
]


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(
        st.sampled_from(JSON_EDGES)
        | JSON_VALUES.map(lambda v: json.dumps(v, separators=(",", ":")).encode())
        | st.binary(max_size=12),
        min_size=1,
        max_size=8,
    )
)
def test_built_in_json_decodes_as_json_loads_does(items):
    """The built-in json format (msgspec, then ``json.loads`` for what msgspec refuses) gives
    ``json.loads``' result for every document, one at a time or as a column: big integers
    stay exact, NaN and Infinity load, UTF-16 and a BOM decode, and what ``json.loads``
    refuses raises."""
    from compactlog.encoding.serde import json_loads, map_decode

    wanted = [_loaded(json.loads, item) for item in items]
    assert [_loaded(json_loads, item) for item in items] == wanted
    if not any(isinstance(w, type) for w in wanted):
        assert [json.dumps(v) for v in map_decode(json_loads, items)] == wanted


def test_a_table_of_a_json_log_keeps_big_integers_and_nan(log_dir):
    with compactlog.open(log_dir, raw=True, key_format="str", value_format="json") as log:
        log.append_batch([(b"big", b"[18446744073709551616]"), (b"nan", b"NaN"), (b"x", b"{}")])
        log.append(b"gone", None)
    with compactlog.open(log_dir) as log, log.table(follow=False) as table:
        assert table["big"] == [2**64]
        assert table["nan"] != table["nan"]  # NaN
        assert table["x"] == {} and "gone" not in table
