"""The package's import graph: no cycle between modules and no edge from a lower layer to a higher one.

Every import counts, also one inside a function or under ``TYPE_CHECKING``: a lazy import hides a
cycle from Python, not from a reader. The layers, bottom to top, are ``LAYERS``; docs/architecture.md
draws them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "control"

# Bottom to top. A module may import its own layer's modules (without a cycle) and any lower layer's.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("control", "control.errors", "control.policyspec", "control.yamlfile"),
    ("control.goodput",),
    ("control.profile",),
    ("control.plan",),
    ("control.policy",),
    ("control.executors",),
    ("control.buildsys", "control.profiler"),
    ("control.agent",),
    ("control.service",),
    ("control.triton", "control.clients"),
    ("control.bench", "control.frontend"),
    ("control.commands", "control.cli", "control.__main__"),
)


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imported(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports (a name imported from a package counts as its module
    where it is one)."""
    out: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names)
    return {m for m in out if m in mods and m != name}


def _layer(name: str) -> int:
    best, rank = -1, -1
    for i, units in enumerate(LAYERS):
        for unit in units:
            if (name == unit or name.startswith(unit + ".")) and len(unit) > best:
                best, rank = len(unit), i
    if rank < 0:
        raise AssertionError(f"module {name} is in no layer: add its package to LAYERS and docs/architecture.md")
    return rank


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imported(name, path, mods) for name, path in mods.items()}


def test_no_import_cycle(graph):
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_upward_import(graph):
    upward = sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps if _layer(b) > _layer(a))
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_the_checker_sees_a_cycle_and_an_upward_edge():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("control.service.app") > _layer("control.agent")
