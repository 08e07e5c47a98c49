"""Point-in-time restores follow the current timeline (docs/archive.md section 8): across
a restore archived again to the same URL (the restore drill), and across logs sharing a
URL; an as-of that the timeline does not reach names its oldest retained manifest."""

from __future__ import annotations

import json
import random
import shutil

import pytest

import compactlog
from compactlog.archive import manifest as manifests
from compactlog.archive import open_store
from compactlog.archive.push import Archiver
from compactlog.archive.restore import restore
from compactlog.errors import NoManifestError

from ..test_cli import run
from .helpers import Model, new_log, records_of, state_of

RECORDS = 200  # per push (the drill of docs/archive.md uses 20,000)


def pushes(path, store, model: Model, count: int, seed: int) -> list[int]:
    """``count`` rounds of ``RECORDS`` records appended then pushed: the manifests' ends."""
    rng = random.Random(seed)
    ends = []
    log = compactlog.open(path, create=False)
    reader = compactlog.open(path, read_only=True)
    archiver = Archiver(reader, store)
    archiver.start()
    try:
        for _ in range(count):
            model.append(log, rng, RECORDS, keys=60)
            ends.append(archiver.push().manifest.end_offset)
    finally:
        archiver.stop()
        reader.close()
        log.close()
    return ends


def test_the_restore_drill_restores_the_current_timeline(tmp_path):
    url = f"file://{tmp_path}/archive"
    store = open_store(url)
    new_log(tmp_path / "app", segment_bytes=1 << 20).close()
    first = Model()
    ends = pushes(tmp_path / "app", store, first, 10, seed=1)
    assert ends[4] == 5 * RECORDS
    # the drill: restore as of offset 1,000, move it into place, archive it again
    done = run("archive", "restore", url, tmp_path / "back", "--as-of-offset", 5 * RECORDS)
    assert "Traceback" not in done.stderr
    shutil.rmtree(tmp_path / "app")
    (tmp_path / "back").rename(tmp_path / "app")
    second = Model()
    second.records = [r for r in first.records if r[0] < 5 * RECORDS]
    later = pushes(tmp_path / "app", store, second, 3, seed=2)
    assert later == [6 * RECORDS, 7 * RECORDS, 8 * RECORDS]
    # offsets the abandoned generation also had: the current timeline's manifest
    chosen = manifests.choose(store, as_of_offset=int(6.25 * RECORDS))
    assert chosen.generation == 1 and chosen.end_offset == 6 * RECORDS
    restore(store, str(tmp_path / "at-1250"), as_of_offset=int(6.25 * RECORDS))
    assert state_of(tmp_path / "at-1250") == second.state(6 * RECORDS)
    # before the fork: the first generation's manifests up to the one restored
    chosen = manifests.choose(store, as_of_offset=int(3.5 * RECORDS))
    assert chosen.generation == 0 and chosen.end_offset == 3 * RECORDS
    restore(store, str(tmp_path / "at-700"), as_of_offset=int(3.5 * RECORDS))
    assert records_of(tmp_path / "at-700") == records_of(tmp_path / "at-1250", 3 * RECORDS)
    # by time: the newest manifest of the timeline committed by then
    newest = manifests.latest(store)
    assert manifests.choose(store, as_of_time_ms=newest.time_ms).sequence == newest.sequence
    # a time when the abandoned generation was newest: the fork, manifest 4
    abandoned = manifests.load(store, 9)
    assert abandoned.generation == 0
    assert manifests.choose(store, as_of_time_ms=abandoned.time_ms).sequence == 4


def test_logs_sharing_a_url_restore_their_own_timeline(tmp_path):
    url = f"file://{tmp_path}/archive"
    store = open_store(url)
    new_log(tmp_path / "one", segment_bytes=1 << 20).close()
    new_log(tmp_path / "two", segment_bytes=1 << 20).close()
    pushes(tmp_path / "one", store, Model(), 3, seed=3)
    two = Model()
    ends = pushes(tmp_path / "two", store, two, 3, seed=4)
    assert manifests.load(store, 3).end_offset == ends[0] == RECORDS
    chosen = manifests.choose(store, as_of_offset=RECORDS)
    assert chosen.sequence == 3
    restore(store, str(tmp_path / "r"), as_of_offset=RECORDS)
    assert state_of(tmp_path / "r") == two.state(RECORDS)
    with pytest.raises(NoManifestError) as caught:
        manifests.choose(store, as_of_offset=RECORDS - 1)
    message = str(caught.value)
    assert "the oldest retained one is manifest 3, ending at offset 200, committed at" in message


def test_an_as_of_before_the_timeline_names_its_oldest_manifest(tmp_path):
    url = f"file://{tmp_path}/archive"
    store = open_store(url)
    new_log(tmp_path / "app", segment_bytes=1 << 20).close()
    pushes(tmp_path / "app", store, Model(), 2, seed=5)
    oldest = manifests.load(store, 0)
    with pytest.raises(NoManifestError, match=f"manifest 0, ending at offset {RECORDS}, "):
        manifests.choose(store, as_of_offset=RECORDS - 1)
    early = run("archive", "restore", url, tmp_path / "r", "--as-of-time", "2001-01-01", check=1)
    assert "no retained manifest at or before time" in early.stderr
    assert f"ending at offset {oldest.end_offset}, committed at 20" in early.stderr
    listed = json.loads(run("archive", "list", url, "--json").stdout)["manifests"]
    assert [m["sequence"] for m in listed] == [0, 1]
