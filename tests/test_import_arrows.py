"""The import arrows of ARCHITECTURE.md hold, and no two subpackages import each
other (a cycle through a parent and its child counts: issue 20).

Read from the sources (ast), so a lazy or TYPE_CHECKING import counts too."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("actors", "adapters", "chain", "replay", "tools")
#: What each top-level package may import of the others (chain <- replay <- actors
#: <- tools; adapters imports nothing internal).
MAY_IMPORT = {
    "chain": set(),
    "adapters": set(),
    "replay": {"chain"},
    "actors": {"chain", "replay", "adapters"},
    "tools": {"chain", "replay", "adapters", "actors"},
}


@functools.cache
def _package(module: str) -> str:
    """The package (a folder) a dotted module name lives in."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if (ROOT.joinpath(*parts[:end])).is_dir():
            return ".".join(parts[:end])
    return parts[0]


def _imports(path: Path) -> set[str]:
    rel = path.relative_to(ROOT).with_suffix("").parts
    here = list(rel[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)]
            if node.module:
                found.add(".".join([*base, node.module]))
            else:
                found.update(".".join([*base, a.name]) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("infervisor."):
            found.add((node.module or "").removeprefix("infervisor."))
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("infervisor.")
                for a in node.names
                if a.name.startswith("infervisor.")
            )
    return found


@functools.cache
def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for top in LIBRARY:
        for path in (ROOT / top).rglob("*.py"):
            mine = _package(".".join(path.relative_to(ROOT).with_suffix("").parts))
            for target in _imports(path):
                theirs = _package(target)
                if theirs != mine:
                    graph[mine].add(theirs)
    return graph


def test_the_package_graph_was_read() -> None:
    graph = _package_graph()
    assert {"tools.api.serving", "actors.core", "tools.front"} <= set(graph)
    assert "tools.api" in graph["tools.api.serving"]
    assert "tools.netkit" in graph["tools.front"]


@pytest.mark.parametrize("top", sorted(MAY_IMPORT))
def test_the_arrows_hold(top: str) -> None:
    against = {
        (mine, theirs)
        for mine, targets in _package_graph().items()
        if mine.split(".")[0] == top
        for theirs in targets
        if theirs.split(".")[0] != top and theirs.split(".")[0] not in MAY_IMPORT[top]
    }
    assert not against, f"imports against the arrows: {sorted(against)}"


def test_no_two_packages_import_each_other() -> None:
    graph = _package_graph()
    seen: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        seen[node] = low[node] = len(seen)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in seen:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], seen[nxt])
        if low[node] == seen[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in list(graph):
        if node not in seen:
            visit(node)
    assert not cycles, f"packages that import each other: {cycles}"
