"""The modules of spconv/ import one way: no import cycle (imports inside functions included), and
spconv.pytorch's layers import downward only.

Layers of spconv.pytorch, bottom up:
  ground floor  kernel-map records, activations, int8 views, map rounds (no import of the other layers);
  op wrappers   the ops with their fake kernels and autograd, one route each;
  route         the one module that picks a route and runs a map's rounds;
  faces         spconv 2.x's public modules (and everything else), on top.
"""
import ast
import pathlib
from typing import Dict, List, Set

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "spconv"

GROUND = {"_symsize", "_maps", "_activation", "_qview", "pair_rounds"}
WRAPPERS = {"_native", "_fused", "_grouped", "_int8", "_pool_table"}
ROUTE = {"_route"}
FACES = {"ops", "functional", "core", "conv", "pool", "modules"}


def _modules(package: pathlib.Path) -> Dict[str, pathlib.Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _bound_names(path: pathlib.Path) -> Set[str]:
    """Names a module binds at its top level (definitions, assignments, imports)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def import_graph(package: pathlib.Path) -> Dict[str, Set[str]]:
    """module -> the modules of ``package`` it imports anywhere in its text (functions included).

    ``from pkg import name`` imports the submodule ``pkg.name`` when ``pkg`` has one (a .py file, or an
    extension module: a name the package's __init__ doesn't bind), else ``pkg`` itself. A module's import of
    its own parent package is implied by Python and not counted."""
    mods = _modules(package)
    bound = {}

    def target(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(target(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module
                for alias in node.names:
                    sub = f"{src}.{alias.name}"
                    if sub in mods:
                        deps.add(sub)
                    elif src in mods and mods[src].name == "__init__.py":
                        if src not in bound:
                            bound[src] = _bound_names(mods[src])
                        deps.add(src if alias.name in bound[src] else sub)  # else an extension module
                    else:
                        deps.add(target(src))
        graph[mod] = {d for d in deps if d in mods or d.startswith(package.name + ".")} - {mod}
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["e", "e2"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_graph_counts_imports_inside_functions(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import g\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_no_import_cycle_in_spconv():
    found = cycles(import_graph(PACKAGE))
    assert not found, f"import cycles in spconv/: {found}"


def _layer(mod: str) -> int:
    name = mod.rpartition(".")[2]
    if not mod.startswith("spconv.pytorch.") or mod.count(".") != 2:
        return 3
    return 0 if name in GROUND else 1 if name in WRAPPERS else 2 if name in ROUTE else 3


def test_layers_exist():
    mods = _modules(PACKAGE)
    for name in GROUND | WRAPPERS | ROUTE | FACES:
        assert f"spconv.pytorch.{name}" in mods, name


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_pytorch_layers_import_downward(layer):
    graph = import_graph(PACKAGE)
    bad = [(m, d) for m, deps in graph.items() if m.startswith("spconv.pytorch.") and _layer(m) == layer
           for d in deps if d.startswith("spconv.pytorch") and _layer(d) > layer]
    assert not bad, f"imports from a lower layer into a higher one: {bad}"
