"""``compactlog archive verify``: every object of every manifest present and intact."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import ArchiveError
from . import manifest as manifests
from .manifest import ObjectRef
from .restore import fetch_object
from .store import Store


@dataclass(slots=True)
class VerifyReport:
    manifests: int = 0
    objects: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "manifests": self.manifests,
            "objects": self.objects,
            "bytes": self.bytes,
            "problems": self.problems,
        }


def verify(store: Store, *, threads: int = 8) -> VerifyReport:
    """Read every manifest and fetch every object they name once, checking its size and
    checksums; each problem names the object (or manifest) and the manifests that name it.
    An archive with no manifest is a problem: an empty or mistyped prefix verifies nothing,
    and must not read as "ok"."""
    report = VerifyReport()
    named: dict[str, tuple[ObjectRef, list[int]]] = {}
    found = manifests.sequences(store)
    if not found:
        report.problems.append(
            f"{store.url}: no manifest: the archive is empty, or the URL's prefix is mistyped"
        )
    for sequence in found:
        try:
            manifest = manifests.load(store, sequence)
        except ArchiveError as error:
            report.problems.append(f"{manifests.manifest_key(sequence)}: {error}")
            continue
        report.manifests += 1
        for segment in manifest.segments:
            for ref in segment.objects:
                named.setdefault(ref.key, (ref, []))[1].append(sequence)

    def check(ref: ObjectRef) -> str | None:
        try:
            fetch_object(store, ref, deep=True)
        except ArchiveError as error:
            return str(error)
        return None

    refs = [ref for ref, _ in named.values()]
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="archive-verify") as pool:
        for ref, problem in zip(refs, pool.map(check, refs), strict=True):
            report.objects += 1
            report.bytes += ref.size
            if problem is not None:
                users = named[ref.key][1]
                report.problems.append(
                    f"{problem} (named by manifest{'s' if len(users) > 1 else ''} "
                    f"{', '.join(map(str, users[:5]))}{', ...' if len(users) > 5 else ''})"
                )
    return report


__all__ = ["VerifyReport", "verify"]
