"""No import cycles: every module's imports, wherever written, form a DAG.

A cycle between modules means neither can be read, tested or changed alone
(issue 20). Every ``import`` counts: module level, inside functions and under
``TYPE_CHECKING``, since each is a dependency a reader has to follow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def module_names(package: str) -> dict[str, Path]:
    """Map each dotted module name of *package* to its file."""
    names: dict[str, Path] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
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


def import_graph(package: str) -> dict[str, set[str]]:
    """Edges module -> modules of *package* it imports, from every import statement."""
    modules = module_names(package)
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


# The one cycle left, and why: ``Log.table()`` returns a ``Table`` (log -> table) and a
# ``Table(path)`` opens its logs read-only (table -> log). Breaking it needs ``Table`` to
# take an opener while ``Table(path)`` keeps working: a decision for the lead (issue 20).
KNOWN = {"compactlog": [["compactlog.log", "compactlog.table.table"]]}


@pytest.mark.parametrize("package", ["compactlog", "cli", "cleaner"])
def test_no_import_cycles(package: str) -> None:
    graph = import_graph(package)
    found = [group for group in cycles(graph) if group not in KNOWN.get(package, [])]
    assert not found, "\n".join(_describe(graph, group) for group in found)


def test_cycle_finder_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
