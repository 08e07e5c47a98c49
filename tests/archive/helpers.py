"""Helpers of the archive's tests: a latest-per-key model, and reading a log's state."""

from __future__ import annotations

import os
import random

import compactlog


class Model:
    """Every record appended, in offset order; the latest state as of any offset."""

    def __init__(self) -> None:
        self.records: list[tuple[int, bytes, bytes | None]] = []

    def append(self, log, rng: random.Random, count: int, keys: int = 40) -> None:
        batch = []
        for _ in range(count):
            key = b"key-%03d" % rng.randrange(keys)
            value = None if rng.random() < 0.1 else os.urandom(rng.choice((3, 40, 300)))
            batch.append((key, value))
        if rng.random() < 0.5:
            offsets = list(log.append_batch(batch))
        else:
            offsets = [log.append(k, v) for k, v in batch]
        self.records.extend((o, k, v) for o, (k, v) in zip(offsets, batch, strict=True))

    def state(self, end: int | None = None) -> dict[bytes, bytes]:
        latest: dict[bytes, bytes | None] = {}
        for offset, key, value in self.records:
            if end is not None and offset >= end:
                break
            latest[key] = value
        return {k: v for k, v in latest.items() if v is not None}


def state_of(path) -> dict[bytes, bytes]:
    with compactlog.open(path, create=False, read_only=True) as log:
        return {r.key: r.value for r in log.latest()}


def records_of(path, end: int | None = None) -> list[tuple[int, bytes, bytes | None]]:
    with compactlog.open(path, create=False, read_only=True) as log:
        return [(r.offset, r.key, r.value) for r in log.read(end=end)]


def segment_bytes_of(path) -> int:
    names = [n for n in os.listdir(path) if n.endswith(".log")]
    return sum(os.path.getsize(os.path.join(path, n)) for n in names)


def new_log(path, **config):
    settings = {
        "segment_bytes": 4096,
        "sync": "always",
        "min_compaction_lag_ms": 0,
        "delete_retention_ms": 0,
        "min_cleanable_dirty_ratio": 0.01,
    }
    settings.update(config)
    return compactlog.open(path, **settings)


class ArchivedSource:
    """A source log (2 KiB segments), a read-only open of it and its started archiver:
    the setup of the archive's state machines."""

    def __init__(self, path, store) -> None:
        from compactlog.archive.push import Archiver

        self.path = path
        self.log = new_log(path, segment_bytes=2048)
        self.reader = compactlog.open(path, read_only=True)
        self.archiver = Archiver(self.reader, store)
        self.archiver.start()

    def close(self) -> None:
        self.archiver.stop()
        self.reader.close()
        self.log.close()
