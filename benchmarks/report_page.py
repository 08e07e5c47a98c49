"""The generated sections of ``docs/benchmarks.md``: ``make bench`` replaces only these.

A generated section is fenced by two HTML comments, invisible on the rendered page::

    <!-- generated: results -->
    _From `make bench` at commit 1a2b3c4 (2026-11-28), on Intel Xeon, 2 cores, CPython 3.11.7._

    | Workload | ... |
    <!-- end generated -->

Everything outside the fences is prose written by hand and is never rewritten. A section
the run produced that the page lacks is added at the end of the page under its name; a
section of the page the run did not produce (a benchmark that was not run) keeps its text
and its stamp, which says which commit and machine it came from.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

SECTION = re.compile(
    r"(<!-- generated: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S
)
NEW_PAGE = "# Benchmarks\n\nGenerated sections are rewritten by `make bench`; the rest is prose.\n"


def commit_of(repo: Path) -> str:
    """``1a2b3c4 (2026-11-28)`` of ``repo``'s HEAD, ``+ changes`` when its tree is dirty."""
    try:
        show = ["git", "-C", str(repo), "log", "-1", "--format=%h (%cs)"]
        head = subprocess.run(show, capture_output=True, text=True, check=True).stdout.strip()
        status = ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"]
        dirty = subprocess.run(status, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head} + uncommitted changes" if dirty else head


def stamp(commit: str, info: Mapping[str, str]) -> str:
    """The line that opens every generated section: where its figures came from."""
    machine = f"{info.get('CPU', '?')}, {info.get('Cores', '?')} cores, {info.get('Python', '?')}"
    return f"_From `make bench` at commit {commit}, on {machine}._"


def fenced(name: str, body: str) -> str:
    return f"<!-- generated: {name} -->\n{body.strip()}\n<!-- end generated -->"


def splice(
    page: str, sections: Mapping[str, str], headings: Mapping[str, str] | None = None
) -> str:
    """``page`` with each named section's body replaced; missing ones appended at the end,
    under ``headings[name]`` (default: the name)."""
    left = dict(sections)

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in left:
            return match.group(0)
        return fenced(name, left.pop(name))

    text = SECTION.sub(replace, page)
    for name, body in left.items():
        heading = (headings or {}).get(name, name)
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n{fenced(name, body)}\n"
    return text if text.endswith("\n") else text + "\n"


def update_page(path: Path, sections: Mapping[str, str]) -> None:
    """Rewrite the generated sections of ``path`` (a new page holds only them)."""
    page = path.read_text(encoding="utf-8") if path.exists() else NEW_PAGE
    path.write_text(splice(page, sections), encoding="utf-8")
