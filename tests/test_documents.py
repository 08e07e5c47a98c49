"""The one decoder of versioned JSON documents (``encoding/documents.py``) and its two
users, a snapshot's ``snapshot.json`` and an archive's manifests: each failure is the
user's own error naming its file or object."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactlog.archive.manifest import Manifest
from compactlog.encoding.documents import DocumentKind, decode_document
from compactlog.engine.snapshot import MANIFEST, read_manifest
from compactlog.errors import ArchiveError, SnapshotError
from compactlog.log import open_log

KIND = DocumentKind("thing.json", "compactlog-thing", "thing_version", 2, "a compactlog thing")


class ThingError(Exception):
    pass


def decode(document: object, build=lambda d: d["value"]) -> object:
    data = json.dumps(document).encode() if not isinstance(document, bytes) else document
    return decode_document(data, KIND, build, ThingError)


def test_a_document_of_a_known_version_is_built():
    assert decode({"magic": "compactlog-thing", "thing_version": 2, "value": 7}) == 7
    assert decode({"magic": "compactlog-thing", "thing_version": 1, "value": 8}) == 8


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b"{not json", r"thing.json is not valid JSON \("),
        ([1, 2], "thing.json is not a compactlog thing$"),
        ({"magic": "compactlog-other", "thing_version": 1}, "is not a compactlog thing$"),
        ({"magic": "compactlog-thing"}, r"thing.json has no valid thing_version \(None\)"),
        ({"magic": "compactlog-thing", "thing_version": "1"}, r"no valid thing_version \('1'\)"),
        ({"magic": "compactlog-thing", "thing_version": True}, r"no valid thing_version \(True\)"),
        (
            {"magic": "compactlog-thing", "thing_version": 3},
            r"thing.json version 3 is newer than this compactlog supports \(2\)",
        ),
        ({"magic": "compactlog-thing", "thing_version": 1}, "lacks a field or has a bad one"),
        (
            {"magic": "compactlog-thing", "thing_version": 1, "value": "x"},
            "lacks a field or has a bad one",
        ),
    ],
)
def test_each_failure_is_the_callers_error(document, message):
    with pytest.raises(ThingError, match=message):
        decode(document, build=lambda d: int(d["value"]))


@given(st.binary(max_size=64))
def test_any_bytes_give_a_document_or_the_callers_error(data):
    try:
        decode(data)
    except ThingError:
        pass


def test_a_damaged_snapshot_manifest_is_a_snapshot_error_naming_the_file(tmp_path):
    with open_log(tmp_path / "log") as log:
        log.append(b"k", b"v")
        log.flush()
        log.snapshot(tmp_path / "snap")
    path = tmp_path / "snap" / MANIFEST
    document = json.loads(path.read_bytes())
    document["manifest_version"] = 99
    path.write_text(json.dumps(document))
    newer = re.escape(f"{path}: snapshot.json version 99 is newer")
    with pytest.raises(SnapshotError, match=newer):
        read_manifest(tmp_path / "snap")
    del document["files"]
    document["manifest_version"] = 1
    path.write_text(json.dumps(document))
    with pytest.raises(SnapshotError, match=r"snapshot\.json lacks a field"):
        read_manifest(tmp_path / "snap")


def test_a_damaged_archive_manifest_is_an_archive_error_naming_the_object():
    manifest = Manifest(1, 1, "id", 0, 0, 0, 0, 0, {}, None)
    key = manifest.key
    assert Manifest.decode(manifest.encode(), key) == manifest
    document = manifest.to_json()
    document["version"] = 2
    with pytest.raises(ArchiveError, match="^" + re.escape(f"{key}: manifest version 2 is newer")):
        Manifest.decode(json.dumps(document).encode(), key)
    with pytest.raises(ArchiveError, match="^" + re.escape(f"{key}: manifest is not valid JSON")):
        Manifest.decode(b"\x00", key)
