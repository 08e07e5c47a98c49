"""Manifests: each one a consistent view of the log, committed once and never changed.

``manifests/<sequence, 20 digits>.json`` names the objects that make up every segment of the
log (a segment is one object, or several pieces of a segment archived while it grew), the
end offset, the cleaner point, the log's ``meta`` and ``cleaner.checkpoint``, the time and
the generation. A manifest is committed with put-if-absent under the next sequence number,
so two writers can never both commit the same one; the newest sequence is the archive's
current state. The layout is specified in docs/archive.md (versioned like docs/format.md).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..encoding.documents import DocumentKind, decode_document
from ..errors import ArchiveError, NoManifestError, ObjectMissingError, StoreError
from .store import Store

MANIFEST_MAGIC = "compactlog-archive"
MANIFEST_VERSION = 1
MANIFEST_PREFIX = "manifests/"
OBJECT_PREFIX = "objects/"
SEQUENCE_DIGITS = 20
MANIFEST_KIND = DocumentKind(
    "manifest", MANIFEST_MAGIC, "version", MANIFEST_VERSION, "a compactlog archive manifest"
)


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One immutable object: bytes ``[start, start + size)`` of a segment file."""

    key: str
    start: int
    size: int
    crc32c: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "start": self.start,
            "size": self.size,
            "crc32c": self.crc32c,
            "sha256": self.sha256,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ObjectRef:
        return cls(
            str(value["key"]),
            int(value["start"]),
            int(value["size"]),
            int(value["crc32c"]),
            str(value["sha256"]),
        )


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    """A segment of the log as archived: its objects, back to back from byte 0."""

    base: int
    size: int  # bytes archived: the sum of the objects' sizes
    crc32c: int  # of the whole archived bytes, the objects' CRCs continued
    end_offset: int  # the offset after its last batch (its base when it holds none)
    active: bool  # archived while it was the newest segment (it may grow)
    local: list[int] | None  # the local file's [inode, size, mtime_ns] then (a hint)
    objects: tuple[ObjectRef, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "size": self.size,
            "crc32c": self.crc32c,
            "end_offset": self.end_offset,
            "active": self.active,
            "local": self.local,
            "objects": [o.to_json() for o in self.objects],
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> SegmentEntry:
        return cls(
            int(value["base"]),
            int(value["size"]),
            int(value["crc32c"]),
            int(value["end_offset"]),
            bool(value["active"]),
            value.get("local"),
            tuple(ObjectRef.from_json(o) for o in value["objects"]),
        )


@dataclass(slots=True)
class Manifest:
    """One committed view of the log (docs/archive.md section 3)."""

    sequence: int
    generation: int
    log_id: str
    time_ms: int
    start_offset: int
    end_offset: int
    handed_out: int
    cleaner_point: int
    meta: dict[str, Any]
    cleaner: dict[str, Any] | None
    segments: list[SegmentEntry] = field(default_factory=list)
    archiver: dict[str, Any] = field(default_factory=dict)
    # the first manifest of a generation whose log was restored from this archive: the
    # manifest it was restored from (``sequence``, ``generation``, ``log_id``,
    # ``end_offset``), where the generation's timeline continues (:func:`choose`)
    parent: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        return manifest_key(self.sequence)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def object_keys(self) -> set[str]:
        return {o.key for s in self.segments for o in s.objects}

    def to_json(self) -> dict[str, Any]:
        return {
            "magic": MANIFEST_MAGIC,
            "version": MANIFEST_VERSION,
            "sequence": self.sequence,
            "generation": self.generation,
            "log_id": self.log_id,
            "time_ms": self.time_ms,
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "handed_out": self.handed_out,
            "cleaner_point": self.cleaner_point,
            "meta": self.meta,
            "cleaner": self.cleaner,
            "segments": [s.to_json() for s in self.segments],
            "archiver": self.archiver,
        } | ({"parent": self.parent} if self.parent is not None else {})

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def decode(cls, data: bytes, key: str) -> Manifest:
        def build(document: dict[str, Any]) -> Manifest:
            return cls(
                sequence=int(document["sequence"]),
                generation=int(document["generation"]),
                log_id=str(document["log_id"]),
                time_ms=int(document["time_ms"]),
                start_offset=int(document["start_offset"]),
                end_offset=int(document["end_offset"]),
                handed_out=int(document["handed_out"]),
                cleaner_point=int(document["cleaner_point"]),
                meta=dict(document["meta"]),
                cleaner=document.get("cleaner"),
                segments=[SegmentEntry.from_json(s) for s in document["segments"]],
                archiver=dict(document.get("archiver") or {}),
                parent=document.get("parent"),
            )

        return decode_document(
            data, MANIFEST_KIND, build, lambda message: ArchiveError(message, path=key)
        )


def manifest_key(sequence: int) -> str:
    return f"{MANIFEST_PREFIX}{sequence:0{SEQUENCE_DIGITS}d}.json"


def parse_manifest_key(key: str) -> int | None:
    stem = key[len(MANIFEST_PREFIX) :] if key.startswith(MANIFEST_PREFIX) else ""
    digits = stem[: -len(".json")] if stem.endswith(".json") else ""
    return int(digits) if len(digits) == SEQUENCE_DIGITS and digits.isdigit() else None


def sequences(store: Store) -> list[int]:
    """The sequence numbers of every manifest in the archive, ascending."""
    found = (parse_manifest_key(info.key) for info in store.list(MANIFEST_PREFIX))
    return sorted(s for s in found if s is not None)


def load(store: Store, sequence: int) -> Manifest:
    data, _etag = store.get(manifest_key(sequence))
    return Manifest.decode(data, manifest_key(sequence))


def load_existing(store: Store, sequence: int) -> Manifest:
    """Manifest ``sequence``, or :class:`NoManifestError` naming it when it is not there."""
    try:
        return load(store, sequence)
    except ObjectMissingError:
        raise NoManifestError(
            f"the archive holds no manifest {sequence} (pruned, or never committed)",
            path=store.url,
        ) from None


def latest(store: Store) -> Manifest | None:
    """The archive's current state: its newest manifest (``None`` for an empty archive)."""
    found = sequences(store)
    return load(store, found[-1]) if found else None


def commit(store: Store, manifest: Manifest) -> bool:
    """Put-if-absent ``manifest`` under its sequence number: ``True`` if this call committed
    it, ``False`` if another manifest holds that number. A request whose answer was lost
    (the put may have happened) is retried; finding our own bytes there then counts as
    committed."""
    data = manifest.encode()
    for attempt in range(3):
        try:
            if store.put_if_absent(manifest.key, data) is not None:
                return True
        except StoreError:
            if attempt == 2:
                raise
            continue
        try:
            existing, _etag = store.get(manifest.key)
        except StoreError:
            if attempt == 2:
                raise
            continue
        return existing == data
    return False


def choose(
    store: Store, *, as_of_offset: int | None = None, as_of_time_ms: int | None = None
) -> Manifest:
    """The manifest a restore starts from: the newest, or, on the **current timeline**,
    the newest whose end offset is at most ``as_of_offset`` / whose commit time is at most
    ``as_of_time_ms`` (docs/archive.md section 8).

    The current timeline is the newest manifest's generation, then, when that generation's
    log was restored from this archive, the generation it was restored from up to the
    manifest restored (its ``parent``), and so on. Manifests of other logs sharing the URL,
    and records a restore abandoned, are on no timeline of the current log.

    Generations are runs of consecutive sequence numbers (one archiver per URL at a time,
    and the generation grows whenever another log or a discontinuity commits), and end
    offsets and times grow with the sequence along a timeline; so each step is a binary
    search, loading O(log n) manifests per generation visited."""
    found = sequences(store)
    if not found:
        raise NoManifestError("the archive holds no manifest", path=store.url)
    newest = load(store, found[-1])
    if as_of_offset is None and as_of_time_ms is None:
        return newest
    if as_of_offset is not None:
        target = as_of_offset

        def fits(m: Manifest) -> bool:
            return m.end_offset <= target

        wanted = f"at or before offset {as_of_offset}"
    else:
        moment = int(as_of_time_ms or 0)

        def fits(m: Manifest) -> bool:
            return m.time_ms <= moment

        wanted = f"at or before time {as_of_time_ms} ms ({_iso(moment)})"
    current, upper = newest, len(found) - 1
    oldest = newest
    while True:
        first = _first_of_generation(store, found, upper, current)
        best = _last_fitting(store, found[first : upper + 1], fits)
        if best is not None:
            return best
        oldest = _load_or(store, found[first], oldest)
        parent = current.parent
        if not parent:
            break
        upper = bisect.bisect_right(found, int(parent["sequence"])) - 1
        if upper < 0:
            break
        try:
            current = load(store, found[upper])  # the parent, or the newest retained before it
        except ArchiveError:
            break
        if current.generation != parent.get("generation") or current.log_id != parent.get("log_id"):
            break  # that generation is pruned away
    raise NoManifestError(
        f"no retained manifest {wanted} on the archive's current timeline (the oldest "
        f"retained one is manifest {oldest.sequence}, ending at offset {oldest.end_offset}, "
        f"committed at {_iso(oldest.time_ms)})",
        path=store.url,
    )


def _first_of_generation(store: Store, found: list[int], upper: int, current: Manifest) -> int:
    """The index in ``found`` of the first retained manifest of ``current``'s generation,
    ``found[upper]`` being ``current`` (generations grow with the sequence)."""
    low, high = 0, upper
    while low < high:
        middle = (low + high) // 2
        try:
            candidate = load(store, found[middle])
        except ArchiveError:  # pruned meanwhile (oldest first): look at the newer half
            low = middle + 1
            continue
        same = candidate.generation == current.generation and candidate.log_id == current.log_id
        if same:
            high = middle
        else:
            low = middle + 1
    return low


def _load_or(store: Store, sequence: int, default: Manifest) -> Manifest:
    try:
        return load(store, sequence)
    except ArchiveError:
        return default


def _iso(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _last_fitting(
    store: Store, found: list[int], fits: Callable[[Manifest], bool]
) -> Manifest | None:
    low, high = 0, len(found) - 1
    best: Manifest | None = None
    while low <= high:
        middle = (low + high) // 2
        try:
            candidate = load(store, found[middle])
        except ArchiveError:  # pruned meanwhile: look at the newer half
            low = middle + 1
            continue
        if fits(candidate):
            best = candidate
            low = middle + 1
        else:
            high = middle - 1
    return best


__all__ = [
    "MANIFEST_PREFIX",
    "OBJECT_PREFIX",
    "Manifest",
    "ObjectRef",
    "SegmentEntry",
    "choose",
    "commit",
    "latest",
    "load",
    "load_existing",
    "manifest_key",
    "parse_manifest_key",
    "sequences",
]
