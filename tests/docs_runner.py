"""Runs the code blocks of README.md and docs/*.md as a reader following each page would.

A block does what its language says, unless an HTML comment on the line just above its
fence (a *directive*, visible in the page's source) says otherwise:

- ``python``: executed; the blocks of one page share one namespace, in page order.
- ``sh``, ``bash``, ``console``: ``bash -e`` in the page's directory, the venv's ``bin``
  first on ``PATH``.
- ``<!-- doc: skip (REASON) -->``: not run (a signature, a grammar, or it needs Docker, a
  cluster, root...); REASON is counted in the report. Every block that is neither run nor
  compared must carry one: ``test_docs.py`` fails on an unmarked one.
- ``<!-- doc: setup NAME -->``: the hidden fixture ``SETUPS[NAME]`` runs first; one that
  returns text (an error message it provoked, a command's output) is the output compared.
- ``<!-- doc: output -->``: the block is the standard output of the page's previous run
  block (or setup), compared line by line: ``...`` in a line matches anything; trailing
  blanks and the page's directory are ignored, and every ``pid N`` reads ``pid 4242``.
  ``output wrapped``: a message the page wraps over lines (whitespace runs compared as
  one space); ``output part``: lines found in that order within the output.
- ``<!-- doc: listing DIR -->``: the block is ``ls -la DIR``: its file names and sizes are
  compared with the real directory's (but for the size of a ``.cp.<hex>.lock``: a pid).
- ``<!-- doc: dump FILE -->``: the block is ``xxd FILE`` (or its first lines), compared as
  an output is (``00000040: ...`` stands for a line of bytes that differ between machines).
- ``<!-- doc: new namespace -->``: a python block starting from an empty namespace.

Several directives go in one comment, separated by ``;``. Every page runs in its own empty
directory, as a user would (never the repository root). ``python -m tests.docs_runner``
prints how many blocks of each page run, are compared or are skipped, and why.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGUAGES = {"python": "python", "sh": "shell", "bash": "shell", "console": "shell"}
COMPARE_KINDS = {"output", "listing", "dump"}
FENCE = re.compile(r"^(\s*)```\s*(\S*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*doc:\s*(.*?)\s*-->\s*$")
SHELL_TIMEOUT_S = 120


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{page}:{self.line}"

    @property
    def kind(self) -> str:
        """``skip``, ``python``, ``shell``, a compare kind, or ``unmarked`` (an error)."""
        if "skip" in self.directives:
            return "skip"
        for kind in COMPARE_KINDS:
            if kind in self.directives:
                return kind
        return RUN_LANGUAGES.get(self.language, "unmarked")


def parse_directives(comment: str) -> dict[str, str]:
    """``skip (needs Docker); setup orders`` -> {"skip": "needs Docker", "setup": "orders"}."""
    result = {}
    parts = re.split(r";\s*(?=(?:skip|setup|output|listing|dump|new)\b)", comment)
    for part in filter(None, (p.strip() for p in parts)):
        name, _, argument = part.partition(" ")
        result[name] = argument.strip().removeprefix("(").removesuffix(")")
    return result


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        indent = len(opening.group(1))
        text = "\n".join(line[indent:] for line in lines[index + 1 : end]) + "\n"
        above = DIRECTIVE.match(lines[index - 1]) if index else None
        directives = parse_directives(above.group(1)) if above else {}
        blocks.append(Block(page, index + 1, opening.group(2), text, directives))
        index = end + 1
    return blocks


def hexdump(data: bytes) -> list[str]:
    """``xxd``'s default layout: 16 bytes a line in 2-byte groups, then the printable bytes."""
    lines = []
    for at in range(0, len(data), 16):
        chunk = data[at : at + 16]
        groups = " ".join(chunk[i : i + 2].hex() for i in range(0, len(chunk), 2))
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{at:08x}: {groups:<39}  {text}")
    return lines


PID_FILES = re.compile(r"^\.cp\..*\.lock$")  # hold their last holder's "pid N": sizes vary


def listing_of(directory: Path) -> list[tuple[str, int]]:
    return sorted((p.name, p.stat().st_size) for p in directory.iterdir())


def same_listing(shown: list[tuple[str, int]], real: list[tuple[str, int]]) -> bool:
    """Names alike, and sizes too except those of files that hold a pid."""
    return [n for n, _ in shown] == [n for n, _ in real] and all(
        a == b or PID_FILES.match(n) for (n, a), (_, b) in zip(shown, real, strict=True)
    )


def listed(text: str) -> list[tuple[str, int]]:
    """The (name, size) pairs of an ``ls -la`` listing (its ``#`` command and ``total`` aside)."""
    pairs = []
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#") or fields[0] == "total":
            continue
        if fields[-1] not in (".", ".."):
            pairs.append((fields[-1], int(fields[4])))
    return sorted(pairs)


def matches(expected: str, actual: str, directory: Path, how: str = "") -> bool:
    """Line by line; ``...`` in an expected line stands for any text (``how``: see above)."""
    actual = re.sub(r"\bpid \d+", "pid 4242", actual.replace(f"{directory}/", ""))
    actual = actual.replace(str(directory), "")
    if how == "wrapped":
        actual, expected = " ".join(actual.split()), " ".join(expected.split())
    got = [line.rstrip() for line in actual.splitlines()]
    want = [line.rstrip() for line in expected.splitlines()]
    if how == "part":
        got, want = [g.strip() for g in got], [w.strip() for w in want]
        return any(
            matches("\n".join(want), "\n".join(got[i : i + len(want)]), directory)
            for i in range(len(got) - len(want) + 1)
        )
    if len(got) != len(want):
        return False
    for w, g in zip(want, got, strict=True):
        pattern = ".*".join(re.escape(part) for part in w.split("..."))
        if not re.fullmatch(pattern, g):
            return False
    return True


class DocError(AssertionError):
    pass


@dataclass
class PageRun:
    """One reader's session with one page: its directory, namespace and last output."""

    directory: Path
    setups: dict[str, Callable[[Path, dict[str, Any]], None]]
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "__main__"})
    last_output: str = ""

    def run(self, block: Block) -> None:
        if "setup" in block.directives:
            said = self.setups[block.directives["setup"]](self.directory, self.namespace)
            if isinstance(said, str):
                self.last_output = said
        if "new" in block.directives:
            self.namespace = {"__name__": "__main__"}
        kind = block.kind
        if kind == "python":
            self.last_output = self._python(block)
        elif kind == "shell":
            self.last_output = self._shell(block)
        elif kind == "output":
            how = block.directives["output"]
            if not matches(block.text, self.last_output, self.directory, how):
                raise DocError(f"{block.where}: the output differs:\n{self.last_output}")
        elif kind == "listing":
            real = listing_of(self.directory / block.directives["listing"])
            if not same_listing(listed(block.text), real):
                raise DocError(f"{block.where}: the directory holds {real}")
        elif kind == "dump":
            real = hexdump((self.directory / block.directives["dump"]).read_bytes())
            shown = "\n".join(real[: len(block.text.splitlines())])
            if not matches(block.text, shown, self.directory):
                raise DocError(f"{block.where}: the file holds\n" + "\n".join(real))

    def _python(self, block: Block) -> str:
        out = io.StringIO()
        code = compile(block.text, block.where, "exec")
        with contextlib.redirect_stdout(out):
            exec(code, self.namespace)
        return out.getvalue()

    def _shell(self, block: Block) -> str:
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        result = subprocess.run(
            ["bash", "-e", "-c", block.text],
            cwd=self.directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=SHELL_TIMEOUT_S,
        )
        if result.returncode:
            raise DocError(f"{block.where}: exit {result.returncode}\n{result.stderr}")
        return result.stdout


def run_page(
    page: Path,
    directory: Path,
    setups: dict[str, Any],
    after_block: Callable[[], None] = lambda: None,
) -> None:
    """Every block of ``page`` in order, in ``directory`` (the working directory meanwhile);
    ``after_block`` runs after each (the Spark page stops the streams a block started)."""
    session = PageRun(directory, setups)
    before = Path.cwd()
    os.chdir(directory)
    try:
        for block in blocks_of(page):
            if block.kind == "skip":
                continue
            started = time.perf_counter()
            try:
                session.run(block)
            except DocError:
                raise
            except BaseException as error:
                raise DocError(f"{block.where}: {type(error).__name__}: {error}") from error
            after_block()
            if os.environ.get("DOCS_TIMES"):
                print(f"{block.where}: {time.perf_counter() - started:.2f} s", file=sys.stderr)
    finally:
        os.chdir(before)
        for value in session.namespace.values():  # the reader's process ends: logs, tables
            if type(value).__module__.startswith("compactlog.") and hasattr(value, "close"):
                with contextlib.suppress(Exception):
                    value.close()


def report() -> str:
    lines, totals = [], {"run": 0, "compared": 0, "skipped": 0, "unmarked": 0}
    for page in PAGES:
        counts, skips = dict.fromkeys(totals, 0), []
        for block in blocks_of(page):
            kind = block.kind
            group = {"python": "run", "shell": "run", "skip": "skipped"}.get(kind, kind)
            group = "compared" if kind in COMPARE_KINDS else group
            counts[group] += 1
            if kind == "skip":
                skips.append(f"    skip {block.where}: {block.directives['skip']}")
            if kind == "unmarked":
                skips.append(
                    f"    UNMARKED {block.where}: [{block.language}] neither run nor marked"
                )
        totals = {k: totals[k] + counts[k] for k in totals}
        summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
        lines += [f"{page.relative_to(ROOT)}: {summary or 'no blocks'}", *skips]
    lines.append("total: " + ", ".join(f"{v} {k}" for k, v in totals.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
