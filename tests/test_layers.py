"""Imports go down the layers, and form no cycle.

Each folder of ``compactlog/`` is one layer of docs/architecture.md and has a rank
(``RANKS``); a module may import modules of its own rank or lower, never higher: an upward
import fails naming both ends. The operator CLI (``cli/``) and the cleaner service
(``cleaner/``) install as ``compactlog.cli`` and ``compactlog.cleaner`` and are checked in
the same graph under those names. Every ``import`` counts: module level, inside functions
and under ``TYPE_CHECKING``, since each is a dependency a reader has to follow. A cycle
between modules (even of one rank) means neither can be read, tested or changed alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# folder in the repository -> the name it is installed under (setup.py)
INSTALLED_AS = {
    "compactlog": "compactlog",
    "cli": "compactlog.cli",
    "cleaner": "compactlog.cleaner",
}

# Each layer's rank, by the longest matching module prefix: imports go to a rank at most
# the importer's. docs/architecture.md draws the same list.
RANKS = {
    "compactlog.errors": 0,  # base
    "compactlog.config": 0,
    "compactlog.encoding": 1,  # bytes
    "compactlog.storage": 2,  # files
    "compactlog.engine": 3,  # the log engine
    "compactlog.compaction": 4,  # features on an open log
    "compactlog.arrow": 4,
    "compactlog.table": 5,
    "compactlog": 6,  # the facade: Log, open, repair, the package's names
    "compactlog.restore": 6,  # bulk reads without Spark: planning, the Arrow restore engine
    "compactlog.spark": 7,  # applications
    "compactlog.archive": 6,  # the archive in object storage: beside the facade it uses (open)
    "compactlog.cleaner": 7,
    "compactlog.cli": 8,  # the CLI also starts and inspects the cleaner service
    "compactlog.__main__": 8,  # python -m compactlog runs the CLI
}


def module_names(package: str) -> dict[str, Path]:
    """Map each dotted module name (as installed) of the folder *package* to its file."""
    names: dict[str, Path] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT / package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join([INSTALLED_AS[package], *parts])] = path
    return names


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(*packages: str) -> dict[str, set[str]]:
    """Edges module -> modules of *packages* it imports, from every import statement."""
    modules = {name: path for package in packages for name, path in module_names(package).items()}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(name, is_package, node)
                # `from . import x` depends on the module x when x is one, and on
                # the package itself only for names that are not modules.
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    targets.append(submodule if submodule in modules else source)
            for target in targets:
                # `import a.b.c` depends on the deepest module of ours it names.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def _describe(graph: dict[str, set[str]], group: list[str]) -> str:
    members = set(group)
    edges = [f"{a} -> {b}" for a in group for b in sorted(graph[a] & members)]
    return "cycle among " + ", ".join(group) + ": " + "; ".join(edges)


def rank(module: str) -> int:
    """The rank of the longest prefix of *module* in ``RANKS``."""
    name = module
    while name not in RANKS:
        name, dot, _ = name.rpartition(".")
        assert dot, f"{module} is in no layer: add its folder to RANKS"
    return RANKS[name]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a module to one of a higher rank, as ``a (rank) -> b (rank)``."""
    return [
        f"{a} ({rank(a)}) -> {b} ({rank(b)})"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if rank(b) > rank(a) and (a, b) not in KNOWN_UPWARD
    ]


# The one exception, and why: ``Log.table()`` returns a ``Table`` (log -> table) and a
# ``Table(path)`` opens its logs read-only (table -> log, upward and a cycle). Breaking it
# needs ``Table`` to take an opener while ``Table(path)`` keeps working (issue 20).
KNOWN_UPWARD = {("compactlog.table.table", "compactlog.log")}
KNOWN_CYCLES = [["compactlog.log", "compactlog.table.table"]]


def test_imports_go_down_the_layers() -> None:
    found = upward(import_graph(*INSTALLED_AS))
    assert not found, "upward imports:\n" + "\n".join(found)


def test_no_import_cycles() -> None:
    graph = import_graph(*INSTALLED_AS)
    found = [group for group in cycles(graph) if group not in KNOWN_CYCLES]
    assert not found, "\n".join(_describe(graph, group) for group in found)


def test_layer_check_reports_an_upward_import() -> None:
    graph = {"compactlog.storage.segment": {"compactlog.engine.writer"}}
    assert upward(graph) == ["compactlog.storage.segment (2) -> compactlog.engine.writer (3)"]


def test_cycle_finder_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


MAX_MODULE_LINES = 800  # a module past this has grown a second job: give it its own module


def test_every_module_stays_under_the_line_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for package in INSTALLED_AS
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) >= MAX_MODULE_LINES
    ]
    assert not long, f"modules of {MAX_MODULE_LINES} lines or more: {long}"
