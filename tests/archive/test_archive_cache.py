"""The cache that archive reads (Spark's, and the Arrow engine's) fetch segments into:
bounded in manifests and bytes, one copy of each unchanged segment, least recently read
evicted first (compactlog/restore/archive_cache.py)."""

from __future__ import annotations

import os
import random

import pyarrow.parquet as pq
import pytest

from compactlog.archive import manifest as manifests
from compactlog.archive import open_store
from compactlog.archive.push import push_once
from compactlog.restore import archive_cache
from compactlog.restore.archive_read import CACHE_NAME
from compactlog.restore.arrow_restore import write_arrow_table
from compactlog.restore.options import ReadOptions

from .helpers import Model, new_log

READS = 6


@pytest.fixture
def archive(tmp_path):
    """An archive of six manifests of one log: each adds records (the older segments stay
    unchanged), one a compaction (segments rewritten); the model as of each."""
    rng = random.Random(71)
    url = f"file://{tmp_path}/archive"
    store = open_store(url)
    log = new_log(tmp_path / "source", segment_bytes=2048)
    model = Model()
    states = []
    for round_ in range(READS):
        model.append(log, rng, 60)
        if round_ == 2:
            log.compact(force=True)
        log.flush()
        push_once(log.path, store)
        states.append(model.state())
    log.close()
    return url, store, states


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    monkeypatch.setattr(archive_cache, "GRACE_S", 0.0)
    return tmp_path / "tmp" / CACHE_NAME


def read_all(url: str, sequence: int, out) -> dict[bytes, bytes]:
    options = ReadOptions(path=url, archive_sequence=sequence)
    write_arrow_table(options, str(out), "parquet")
    table = pq.read_table(str(out)).to_pydict()
    return dict(zip(table["key"], table["value"], strict=True))


def on_disk(root) -> tuple[int, int]:
    """(manifest directories, bytes of distinct files) under the cache."""
    directories, seen, size = 0, set(), 0
    for archive in os.listdir(root):
        for name in os.listdir(root / archive):
            directories += name != archive_cache.SHARED
        for folder, _dirs, files in os.walk(root / archive):
            for file in files:
                info = os.stat(os.path.join(folder, file))
                if info.st_ino not in seen:
                    seen.add(info.st_ino)
                    size += info.st_size
    return directories, size


def test_reads_of_successive_manifests_share_segments_and_keep_four(tmp_path, archive, cache_root):
    url, store, states = archive
    sequences = manifests.sequences(store)
    assert len(sequences) == READS
    for i, sequence in enumerate(sequences):
        assert read_all(url, sequence, tmp_path / f"out{i}") == states[i]
    directories, size = on_disk(cache_root)
    assert directories == archive_cache.KEEP_MANIFESTS  # was one full copy per read
    kept = [manifests.load(store, s) for s in sequences[-archive_cache.KEEP_MANIFESTS :]]
    distinct = {(s.base, s.size, s.crc32c): s.size for m in kept for s in m.segments}
    assert size <= sum(distinct.values())  # a segment unchanged between manifests: one copy


def test_the_byte_bound_evicts_least_recently_read_first_after_a_grace_period(
    tmp_path, archive, cache_root, monkeypatch
):
    url, store, states = archive
    sequences = manifests.sequences(store)
    monkeypatch.setenv("COMPACTLOG_ARCHIVE_CACHE_BYTES", "1")
    monkeypatch.setattr(archive_cache, "GRACE_S", 3600.0)
    read_all(url, sequences[0], tmp_path / "a")
    read_all(url, sequences[1], tmp_path / "b")
    assert on_disk(cache_root)[0] == 2  # read within the grace: a task may be about to open it
    monkeypatch.setattr(archive_cache, "GRACE_S", 0.0)
    assert read_all(url, sequences[-1], tmp_path / "c") == states[-1]
    directories, size = on_disk(cache_root)
    assert directories == 1  # only the manifest just read
    assert size == manifests.load(store, sequences[-1]).total_bytes


def test_a_fresh_shared_copy_outlives_another_processs_eviction_until_it_is_linked(tmp_path):
    """Between one process's fill of a shared copy and its link into a manifest's directory
    the copy has one link; another process's eviction then must not take it (the link
    failed and the read task with it)."""
    root = tmp_path / "cache" / "archive-1"
    shared = root / archive_cache.SHARED
    shared.mkdir(parents=True)
    copy = shared / archive_cache.shared_name(0, 3, 7)
    copy.write_bytes(b"abc")  # filled, not linked yet
    now = copy.stat().st_mtime
    assert archive_cache.evict(str(tmp_path / "cache"), keep="", now=now + 1) == 0
    assert copy.exists()
    after = now + archive_cache.GRACE_S + 1  # never linked: the next eviction drops it
    assert archive_cache.evict(str(tmp_path / "cache"), keep="", now=after) == 3
    assert not copy.exists()


def test_a_fetch_that_fails_leaves_no_partial_copy_behind(tmp_path):
    """Eviction never removes a ``.part`` (another task may be writing it), so a fill that
    fails must remove its own: else its bytes count against the bound for good."""
    store = tmp_path / "archive"

    def failing_fill(part: str) -> None:
        with open(part, "wb") as handle:
            handle.write(b"half a segment")
        raise OSError("the store went away")

    (tmp_path / "7").mkdir()
    with pytest.raises(OSError, match="went away"):
        archive_cache.link_segment(
            str(store),
            str(tmp_path / "7"),
            "0.log",
            archive_cache.shared_name(0, 9, 1),
            failing_fill,
        )
    assert os.listdir(store / archive_cache.SHARED) == []
