"""The import graph of autopar has no cycle, lazy (function-level) imports included: inputs → cost →
search / report → api → cli, one way."""

from __future__ import annotations

import ast
from pathlib import Path

import autopar

ROOT = Path(autopar.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module (or package) of autopar that importing `name` executes."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_edges() -> dict[str, set[str]]:
    """module -> the autopar modules it imports anywhere in its body (top level or inside functions)."""
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for t in targets:
                owner = _owner(t, modules) if t.startswith("autopar") else None
                if owner and owner != mod:
                    edges[mod].add(owner)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan 1972), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_lazy_cycle():
    # The shape this project had: api imported search lazily, search's driver imported api lazily.
    edges = {"autopar.api": {"autopar.search.driver"}, "autopar.search.driver": {"autopar.api"}, "autopar.cli": set()}
    assert cycles(edges) == [["autopar.api", "autopar.search.driver"]]


def test_edges_include_function_level_imports():
    edges = import_edges()
    assert "autopar.search" in edges["autopar.report.sweep"]  # imported inside sweep()
    assert "autopar.inputs" in edges["autopar.search.driver"]


def test_import_graph_has_no_cycle():
    assert cycles(import_edges()) == []


def test_search_and_report_do_not_import_the_api():
    edges = import_edges()
    for mod, targets in edges.items():
        if mod.startswith(("autopar.search", "autopar.report", "autopar.cost", "autopar.inputs")):
            assert "autopar.api" not in targets and "autopar.cli" not in targets, mod
