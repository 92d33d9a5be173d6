"""The import graph of autopar has no cycle, lazy (function-level) imports included, and runs one
way between its packages: the cost model below the search and the run prediction (validate, with
the error bands), both below the reports; calibration (fit, then leave-one-source-out) above the run
prediction; the api above all of them, and the cli above the api alone."""

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


def _under(mod: str, prefixes: tuple[str, ...]) -> bool:
    """`mod` starts with one of the name prefixes ("autopar.calibrat" takes autopar.calibration.fit)."""
    return mod.startswith(prefixes)


# What each layer must never import (a lazy import counts).
_ABOVE_COST = ("autopar.validate", "autopar.calibrat", "autopar.report", "autopar.api", "autopar.cli",
               "autopar.export")
_FORBIDDEN = {
    "autopar.cost.": _ABOVE_COST,  # the cost model knows nothing of its validation, bands or reports
    "autopar.search.": _ABOVE_COST,
    "autopar.validate.": ("autopar.calibrat", "autopar.api", "autopar.cli"),  # run prediction sits below the refits
    "autopar.calibration.": ("autopar.api", "autopar.cli"),
}


def test_each_layer_imports_nothing_above_it():
    edges = import_edges()
    for layer, above in _FORBIDDEN.items():
        members = [m for m in edges if m.startswith(layer)]
        assert members, layer
        for mod in members:
            bad = sorted(t for t in edges[mod] if _under(t, above))
            assert not bad, f"{mod} imports {bad}"


# The CLI calls autopar.api; beside it only rendering and what parsing the options needs.
_CLI_MAY_IMPORT = {"autopar.api", "autopar.listings", "autopar.report.tables", "autopar.report.records",
                   "autopar.report.plots", "autopar.errors", "autopar.choices", "autopar.limits",
                   "autopar.cli_coercion"}
# Modules holding analysis and its rendering: the CLI takes only their render_* functions.
_CLI_RENDERS_FROM = {"autopar.report.explain", "autopar.report.sweep"}


def _cli_imports() -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of every autopar import of cli.py, its _Lazy("autopar....") modules included."""
    tree = ast.parse((ROOT / "cli.py").read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autopar"):
            out.append((node.module, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            out += [(a.name, ()) for a in node.names if a.name.startswith("autopar")]
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_Lazy" and node.args
              and isinstance(node.args[0], ast.Constant) and node.args[0].value.startswith("autopar")):
            out.append((node.args[0].value, ()))
    return out


def test_cli_calls_only_the_api():
    imports = _cli_imports()
    assert ("autopar.api", ()) in imports  # seen through _Lazy
    for module, names in imports:
        if module in _CLI_RENDERS_FROM:
            assert names and all(n.startswith("render_") for n in names), (module, names)
        else:
            assert module in _CLI_MAY_IMPORT, module


def test_listings_import_no_cost_model():
    """autopar models and autopar clusters go through autopar.listings, which api re-exports."""
    edges = import_edges()
    seen, todo = set(), ["autopar.listings"]
    while todo:
        mod = todo.pop()
        if mod not in seen:
            seen.add(mod)
            todo += edges[mod]
    assert not any(_under(m, ("autopar.cost", "autopar.search", "autopar.api")) for m in seen), sorted(seen)


def package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between top-level packages and modules of autopar (autopar.cost, autopar.api,
    ...): A -> B when a module of A imports a module of B."""
    def top(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    out: dict[str, set[str]] = {top(m): set() for m in edges}
    for mod, targets in edges.items():
        out[top(mod)] |= {top(t) for t in targets if top(t) != top(mod)}
    return out


def test_package_edges_group_by_top_level_package():
    grouped = package_edges({"autopar.cost.step": {"autopar.validate.bands"}, "autopar.validate.bands": set(),
                             "autopar.validate.runner": {"autopar.cost.step"}})
    assert grouped == {"autopar.cost": {"autopar.validate"}, "autopar.validate": {"autopar.cost"}}
    assert cycles(grouped) == [["autopar.cost", "autopar.validate"]]


def test_packages_import_each_other_one_way():
    assert cycles(package_edges(import_edges())) == []
