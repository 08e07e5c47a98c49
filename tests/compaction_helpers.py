"""Helpers of the compaction suites: a written-records model and checks against it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import compactlog
from compactlog.engine.latest import latest_dict


@dataclass
class Model:
    """Everything appended: offset -> (key, value), and the last offset of each key."""

    written: dict[int, tuple[bytes, bytes | None]] = field(default_factory=dict)
    last: dict[bytes, int] = field(default_factory=dict)

    def add(self, offset: int, key: bytes, value: bytes | None) -> None:
        self.written[offset] = (key, value)
        self.last[key] = offset

    def append(self, log: Any, key: bytes, value: bytes | None, **kw: Any) -> int:
        offset = log.append(key, value, **kw)
        self.add(offset, key, value)
        return offset

    def append_batch(self, log: Any, pairs: list[tuple[bytes, bytes | None]], **kw: Any) -> range:
        offsets = log.append_batch(pairs, **kw)
        for offset, (key, value) in zip(offsets, pairs, strict=True):
            self.add(offset, key, value)
        return offsets

    def live(self) -> dict[bytes, bytes]:
        result = {}
        for key, offset in self.last.items():
            value = self.written[offset][1]
            if value is not None:
                result[key] = value
        return result


def check_log(log: Any, model: Model) -> list[Any]:
    """Kafka's guarantees: every record read was written at that offset, offsets ascend,
    every key's latest record is present (a deleted key reads as deleted or absent), and
    ``latest()`` equals the model. Returns the records read."""
    records = list(log.read())
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets)), "offsets repeat or go backwards"
    seen: dict[bytes, int] = {}
    for record in records:
        assert record.offset in model.written, f"offset {record.offset} was never written"
        assert model.written[record.offset] == (record.key, record.value), record
        seen[record.key] = record.offset
    for key, offset in model.last.items():
        value = model.written[offset][1]
        if value is not None:
            assert seen.get(key) == offset, f"latest value of {key!r} at {offset} missing"
        else:
            got = seen.get(key)
            assert got is None or model.written[got][1] is None, f"deleted {key!r} reads live"
    assert latest_dict(log) == model.live()
    return records


def rewrite_files(directory: str | os.PathLike[str]) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".rw"))


def open_log(path: Any, clock: Any = None, **config: Any) -> Any:
    return compactlog.open(path, clock=clock, **config)
