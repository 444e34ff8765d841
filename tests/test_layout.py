"""The package layout: no import circle inside routecast, and every import between stages points down.

The module import graph is read with ast from the source (no module is imported): every `import` and
`from ... import` naming a routecast module counts, at module level, inside functions and under
TYPE_CHECKING alike, since each is a dependency someone reading or moving the code has to follow.
Stage order, top to bottom (a stage may import only the stages below it; place, cache and schedule are peers
and import none of each other):
    cli, demo, report, advise, runtime, serve, place | cache | schedule, sim, predict, trace, models, common
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "routecast"
ORDER = ("cli", "demo", "report", "advise", "runtime", "serve", ("place", "cache", "schedule"), "sim", "predict",
         "trace", "models", "common")
RANK = {s: i for i, level in enumerate(ORDER) for s in (level if isinstance(level, tuple) else (level,))}
# Circles another helper is removing at the time of writing; each entry must still be a circle (so a fixed one
# is struck from the list) and nothing else may join one. runtime/offload belongs to the offload work (issue 24).
KNOWN_CIRCLES: list[frozenset[str]] = []


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py under the package (a package is its __init__.py)."""
    out = {}
    for p in sorted(package.rglob("*.py")):
        parts = list(p.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the routecast modules it imports (an imported name that is a submodule counts as that module;
    otherwise the longest module prefix of the dotted name)."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names if a.name.split(".")[0] == "routecast"}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    name = ".".join(base + ([node.module] if node.module else []))
                else:
                    name = node.module or ""
                if name.split(".")[0] != "routecast":
                    continue
                for a in node.names:
                    full = f"{name}.{a.name}"
                    deps.add(full if full in mods else resolve(name))
        graph[mod] = deps - {None, mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


def stage(mod: str) -> str | None:
    """routecast.<stage>[...] -> stage (the top-level modules cli.py and demo.py are stages of their own)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b (why)' for each import from one stage into a stage not below it."""
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = stage(mod), stage(dep)
            if a is None or b is None or a == b:
                continue
            if a not in RANK or b not in RANK:
                bad.append(f"{mod} -> {dep} (stage {a if a not in RANK else b!r} is not in the stage order)")
            elif RANK[b] == RANK[a]:
                bad.append(f"{mod} -> {dep} (peers {a} and {b} must not import each other)")
            elif RANK[b] < RANK[a]:
                bad.append(f"{mod} -> {dep} ({b} is above {a})")
    return bad


@pytest.fixture(scope="module")
def graph():
    return import_graph(module_files())


def test_the_graph_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "routecast"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from . import x\n")
    (pkg / "a" / "x.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .y import Y\n")
    (pkg / "a" / "y.py").write_text("def f():\n    import routecast.a.z.w\n")
    (pkg / "a" / "z.py").write_text("from routecast.a import x, y\nfrom routecast.a.x import thing\n")
    g = import_graph(module_files(pkg))
    assert g["routecast.a"] == {"routecast.a.x"}
    assert g["routecast.a.x"] == {"routecast.a.y"}  # under TYPE_CHECKING, relative
    assert g["routecast.a.y"] == {"routecast.a.z"}  # inside a function; .w is a name in z
    assert g["routecast.a.z"] == {"routecast.a.x", "routecast.a.y"}
    assert circles(g) == [frozenset({"routecast.a.x", "routecast.a.y", "routecast.a.z"})]
    assert circles({"p": {"q"}, "q": set()}) == []


def test_the_stage_rule_flags_upward_and_peer_imports():
    g = {"routecast.sim.cost": {"routecast.serve.loop", "routecast.trace.io"},
         "routecast.cache.replay": {"routecast.place.slots", "routecast.common.errors"},
         "routecast.cli": {"routecast.report.html"}}
    assert upward_imports(g) == ["routecast.cache.replay -> routecast.place.slots (peers cache and place must not "
                                 "import each other)", "routecast.sim.cost -> routecast.serve.loop (serve is above sim)"]


def test_no_import_circle_inside_routecast(graph):
    found = circles(graph)
    new = [sorted(c) for c in found if c not in KNOWN_CIRCLES]
    assert not new, f"import circles: {new}"
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert not gone, f"no longer circles, strike them from KNOWN_CIRCLES: {gone}"


def test_imports_point_down_the_stage_order(graph):
    assert {stage(m) for m in graph} - {None} <= set(RANK), "a new stage: place it in ORDER"
    assert upward_imports(graph) == []
