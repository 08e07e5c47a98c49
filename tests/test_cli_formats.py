"""The CLI's printing of logs that declare key and value formats (``dump``, ``tail``,
``get``), run through the installed ``compactlog`` script."""

from __future__ import annotations

import json

import pytest

import compactlog

from .test_cli import run, run_json

ADA = {"name": "Ada", "langs": ["\u00e9", 1]}


@pytest.fixture
def declared(tmp_path):
    """A log declaring ``key_format="str"``, ``value_format="json"``: a JSON object, a
    tombstone, a JSON string; then, written raw, a value that is not JSON."""
    path = tmp_path / "log"
    with compactlog.open(path, key_format="str", value_format="json") as log:
        log.append("user:1", ADA)
        log.append("user:2", None)
        log.append("user:3", "text")
    with compactlog.open(path, raw=True) as log:
        log.append(b"user:4", b"{broken")
    return path


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_dump_prints_json_values_as_json_and_names_a_value_that_is_not(declared):
    result = run("dump", declared, "--json", check=1)
    lines = json_lines(result.stdout)
    assert [(line["key"], line["value"]) for line in lines] == [
        ("user:1", ADA),
        ("user:2", None),
        ("user:3", "text"),
        ("user:4", "{broken"),
    ]
    assert "offset 3 is not valid json" in result.stderr
    text = run("dump", declared, "--to", "3").stdout.splitlines()
    assert text[1].endswith('user:1  {"name":"Ada","langs":["\u00e9",1]}')
    assert text[3].endswith('user:3  "text"')


def test_dump_raw_and_hex_show_the_stored_bytes(declared):
    raw = json_lines(run("dump", declared, "--json", "--raw", "--to", "1").stdout)
    assert raw[0]["value"] == '{"name":"Ada","langs":["\u00e9",1]}'
    hexed = json_lines(run("dump", declared, "--json", "-e", "hex", "--to", "1").stdout)
    assert (
        bytes.fromhex(hexed[0]["value"])
        == json.dumps(ADA, ensure_ascii=False, separators=(",", ":")).encode()
    )


def test_tail_prints_declared_formats(declared):
    lines = json_lines(run("tail", declared, "-n", "3", "--json", "--raw").stdout)
    assert [line["value"] for line in lines] == [None, '"text"', "{broken"]
    lines = json_lines(run("tail", declared, "-n", "3", "--json").stdout)
    assert [line["value"] for line in lines] == [None, "text", "{broken"]


def test_get_prints_a_json_value_as_json(declared):
    assert run_json("get", declared, "user:1")["value"] == ADA
    text = run("get", declared, "user:3").stdout
    assert '"text"' in text
    assert run_json("get", declared, "user:1", "--raw")["value"] == json.dumps(
        ADA, ensure_ascii=False, separators=(",", ":")
    )


def test_a_log_without_declared_formats_prints_as_before(tmp_path):
    path = tmp_path / "log"
    with compactlog.open(path) as log:
        log.append(b"k", b'{"a":1}')
    assert json_lines(run("dump", path, "--json").stdout)[0]["value"] == '{"a":1}'
    assert run_json("get", path, "k")["value"] == '{"a":1}'


def test_config_set_refuses_a_format_the_stored_records_do_not_hold(declared):
    """Regression: ``config set value_format=json`` stored the setting over values that
    are not JSON (here: a log of str values, one of them not JSON)."""
    with compactlog.open(declared, update_config=True, value_format="bytes"):
        pass
    result = run("config", "set", declared, "value_format=json", "--force", check=1)
    assert "offset 3" in result.stderr and "value_format='json'" in result.stderr
    assert run_json("config", "get", declared)["value_format"] == "bytes"
    run("config", "set", declared, "value_format=str")
