"""Failing crash states kept as regression fixtures: one JSON file each in ``fixtures/``.

A fixture holds the state (directories, and files zlib-compressed in base64), what was
promised at the crash (records written, acknowledged, commits, snapshots), the workload's
rule and where it came from (workload, model, event, variant, the failures it showed when
saved). ``test_regressions.py`` replays each one through the same checks.
"""

from __future__ import annotations

import base64
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .models import CrashState
from .suite import FailedState
from .workloads import Promise, Workload

FIXTURES = Path(__file__).parent / "fixtures"
ROOT_STAND_IN = b"/powerloss-root"  # for the workload's directory in saved files


@dataclass(frozen=True, slots=True)
class Regression:
    path: Path
    origin: dict[str, Any]
    state: CrashState
    promise: Promise
    workload: Workload


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _bytes(text: str) -> bytes:
    return base64.b64decode(text)


def save(failed: FailedState) -> Path:
    """Write ``failed`` as a fixture (named after workload, model, event and its first
    failure) and return its path."""
    first = failed.failures[0]
    slug = re.sub(r"[^a-z0-9]+", "-", f"{first.phase} {first.kind}".lower()).strip("-")[:60]
    name = f"{failed.workload.name}-{failed.model}-e{failed.event.index:03d}-{slug}.json"
    promise = failed.promise
    document = {
        "origin": {
            "workload": failed.workload.name,
            "model": failed.model,
            "event": failed.event.describe(),
            "variant": failed.state.variant,
            "failures": [str(f) for f in failed.failures],
        },
        "rule": failed.workload.rule,
        "create": failed.workload.create,
        "promise": {
            "first_offset": promise.first_offset,
            "acked": promise.acked,
            "offsets": list(promise.offsets),
            "written": [[_b64(k), None if v is None else _b64(v)] for k, v in promise.written],
            "commits": [list(c) for c in promise.commits],
            "snapshots": [list(s) for s in promise.snapshots],
        },
        "dirs": list(failed.state.dirs),
        "files": {
            path: _b64(zlib.compress(_scrub(data, failed.root), 9))
            for path, data in failed.state.files
        },
    }
    FIXTURES.mkdir(exist_ok=True)
    path = FIXTURES / name
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def _scrub(data: bytes, root: str) -> bytes:
    """``data`` without the temporary directory the workload ran in (no path of the
    machine that saved a fixture is kept)."""
    return data.replace(root.encode(), ROOT_STAND_IN) if root else data


def load(path: str | os.PathLike[str]) -> Regression:
    document = json.loads(Path(path).read_text())
    raw = document["promise"]
    promise = Promise(
        written=tuple((_bytes(k), None if v is None else _bytes(v)) for k, v in raw["written"]),
        first_offset=raw["first_offset"],
        acked=raw["acked"],
        offsets=tuple(raw.get("offsets", ())),
        commits=tuple((name, offset) for name, offset in raw["commits"]),
        snapshots=tuple((p, start, end) for p, start, end in raw["snapshots"]),
    )
    state = CrashState(
        dirs=tuple(document["dirs"]),
        files=tuple(
            (p, zlib.decompress(_bytes(data))) for p, data in sorted(document["files"].items())
        ),
        variant=document["origin"]["variant"],
    )
    origin = document["origin"]
    workload = Workload(
        origin["workload"], lambda session: None, document["rule"], document["create"]
    )
    return Regression(Path(path), origin, state, promise, workload)


def all_fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.json"))
