"""The archive's object-store interface on every store: memory, file:// and real S3."""

from __future__ import annotations

import pytest

from compactlog.archive import ArchiveError, FaultyStore, ObjectMissingError, StoreError, open_store


def test_conditional_writes_and_reads(any_url):
    store = open_store(any_url)
    etag = store.put_if_absent("lease.json", b"one")
    assert etag is not None
    assert store.put_if_absent("lease.json", b"two") is None  # never two creators
    data, current = store.get("lease.json")
    assert data == b"one"
    second = store.put_if_match("lease.json", b"three", current)
    assert second is not None
    assert store.put_if_match("lease.json", b"four", current) is None  # a stale ETag loses
    assert store.get("lease.json")[0] == b"three"
    assert store.put_if_match("absent.json", b"x", second) is None

    store.put("objects/a", b"0123456789")
    assert store.get_range("objects/a", 2, 5) == b"234"
    info = store.head("objects/a")
    assert info is not None and info.size == 10
    assert store.head("objects/missing") is None
    assert [i.key for i in store.list("objects/")] == ["objects/a"]
    with pytest.raises(ObjectMissingError) as missing:
        store.get("objects/missing")
    assert str(missing.value).startswith(f"{any_url.rstrip('/')}/objects/missing: get: ")
    store.delete("objects/a")
    store.delete("objects/a")  # absent already: fine
    assert store.list("objects/") == []


def test_large_object_goes_up_whole(any_url):
    store = open_store(any_url)
    blob = bytes(range(256)) * (80 << 12)  # 20 MiB: a multipart upload on S3
    store.put("objects/big", blob)
    assert store.get("objects/big")[0] == blob


def test_bad_urls_are_refused():
    with pytest.raises(ArchiveError, match="unsupported archive URL scheme 'ftp'"):
        open_store("ftp://host/x")
    with pytest.raises(ArchiveError, match="absolute path"):
        open_store("file://relative/x")


def test_unreachable_server_is_a_store_error(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    from compactlog.archive.store import open_store as open_with

    store = open_with("s3://nowhere/x", retries=1, timeout_s=2)
    with pytest.raises(StoreError, match="object store request failed"):
        store.get("k")


def test_faulty_store_fails_before_or_after():
    inner = open_store("memory://faulty-contract")
    plans = iter(["before", "after", None])
    store = FaultyStore(inner, lambda op, key: next(plans))
    with pytest.raises(StoreError, match="before put"):
        store.put("a", b"1")
    assert inner.head("a") is None  # never arrived
    with pytest.raises(StoreError, match="after put"):
        store.put("a", b"1")
    assert inner.get("a")[0] == b"1"  # done, the answer lost
    assert store.get("a")[0] == b"1"
