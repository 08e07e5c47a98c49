"""Versioned JSON documents: the one decoder of a small JSON object that names its kind
(a ``magic`` string) and the version of its layout, such as a snapshot's ``snapshot.json``
and an archive's manifests.

The checks are the same for every kind, in this order: valid JSON, an object of this kind
(the magic), a layout version this compactlog reads (an integer no newer than it knows),
then the fields, which the caller's ``build`` reads (a missing or mistyped field raises
``KeyError``, ``TypeError`` or ``ValueError`` there). Each failure is raised as the caller's
own error (``error(message)``), whose message names the document as ``kind.name``: the
caller keeps its error type and names its file or object in the error's path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class DocumentKind:
    """What a kind of document is called and how it marks itself."""

    name: str  # how a message names the document ("snapshot.json", "manifest")
    magic: str  # the value of its "magic" field
    version_field: str  # the field holding the layout version
    version: int  # the newest layout version this compactlog reads
    description: str  # what a document of this kind is ("a compactlog snapshot manifest")


def decode_document(
    data: bytes,
    kind: DocumentKind,
    build: Callable[[dict[str, Any]], T],
    error: Callable[[str], Exception],
) -> T:
    """``build(document)`` for the JSON object ``data``, once it is known to be a ``kind``
    document of a version this compactlog reads; any failure raises ``error(message)``."""
    try:
        document = json.loads(data)
    except ValueError as problem:
        raise error(f"{kind.name} is not valid JSON ({problem})") from None
    if not isinstance(document, dict) or document.get("magic") != kind.magic:
        raise error(f"{kind.name} is not {kind.description}")
    version = document.get(kind.version_field)
    if not isinstance(version, int) or isinstance(version, bool):
        raise error(f"{kind.name} has no valid {kind.version_field} ({version!r})")
    if version > kind.version:
        raise error(
            f"{kind.name} version {version} is newer than this compactlog supports ({kind.version})"
        )
    try:
        return build(document)
    except (KeyError, TypeError, ValueError) as problem:
        raise error(f"{kind.name} lacks a field or has a bad one ({problem})") from None


__all__ = ["DocumentKind", "decode_document"]
