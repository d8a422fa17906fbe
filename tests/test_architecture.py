"""The layers run one way: no import cycle between modules or packages (lazy imports included). A module
holds one concept whole, however long; a function stays short: none over 60 lines, except the few listed
below, which may only shrink."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "graphify"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(modules) -> dict[str, set[str]]:
    edges = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("graphify"):
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("graphify")]
            edges[name] |= {t for t in targets if t in modules and t != name}
    return edges


def _cycles(edges) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_modules():
    assert _cycles(_imports(_modules())) == []


def test_no_import_cycle_between_packages():
    def package(name):
        return ".".join(name.split(".")[:2])

    edges = {}
    for source, targets in _imports(_modules()).items():
        edges.setdefault(package(source), set())
        for target in targets:
            edges.setdefault(package(target), set())
            if package(target) != package(source):
                edges[package(source)].add(package(target))
    assert _cycles(edges) == []


FUNCTION_LINES = 60
# functions over the limit today, with their length: each may shrink (then lower or drop its entry), never grow
LONG_FUNCTIONS = {
    "graphify.analysis.values::_call_tensor": 62,
    "graphify.plan.whole::_split_step": 64,
    "graphify.verify.child::main": 64,
}


def _function_lengths() -> dict[str, int]:
    found = {}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[f"{name}::{node.name}"] = max(found.get(f"{name}::{node.name}", 0), node.end_lineno - node.lineno + 1)
    return found


def test_functions_stay_short():
    lengths = _function_lengths()
    too_long = {f: n for f, n in lengths.items() if n > LONG_FUNCTIONS.get(f, FUNCTION_LINES)}
    assert too_long == {}, "split these functions (or, if one shrank, lower its LONG_FUNCTIONS entry)"
    stale = {f: n for f, n in LONG_FUNCTIONS.items() if lengths.get(f, 0) < n}
    assert stale == {}, f"these shrank: lower or drop their entries to { ({f: lengths.get(f, 0) for f in stale}) }"


# plan/ decides and rewrite/ builds: the plan records what is split and moved (indexes, sets of the source's
# nodes, names, code text) and makes no libcst node. The body it reads, mode blocks opened statement by
# statement, is a reading of the source that analysis/step_body.py makes.
_BUILDING_METHODS = {"with_changes", "with_deep_changes", "deep_replace", "deep_clone", "deep_remove", "visit"}


def _nodes_built(source: str, module: str) -> set[str]:
    """`module::function` for each function of `source` that builds libcst nodes: calls `cst.<Node>(...)` or
    `cst.parse_*(...)`, or a method that makes a changed copy (`.with_changes(...)`, `.visit(...)`)."""
    found = set()

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            inner = f"{module}::{child.name}" if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            func = child.func if isinstance(child, ast.Call) else None
            if isinstance(func, ast.Attribute):
                from_libcst = isinstance(func.value, ast.Name) and func.value.id in ("cst", "libcst")
                if func.attr in _BUILDING_METHODS or (from_libcst and (func.attr[:1].isupper() or func.attr.startswith("parse_"))):
                    found.add(where)
            visit(child, inner)

    visit(ast.parse(source), f"{module}::<module>")
    return found


def test_the_building_check_sees_what_builds():
    source = (
        "import libcst as cst\nEMPTY = cst.Module([])\ndef a(n):\n    return n.with_changes(value='x')\ndef b(n):\n    return n.value\n"
    )
    assert _nodes_built(source, "m") == {"m::<module>", "m::a"}


def test_plan_builds_no_libcst_node():
    built = set()
    for name, path in _modules().items():
        if name.startswith("graphify.plan"):
            built |= _nodes_built(path.read_text(), name)
    assert built == set(), "plan/ describes; rewrite/ builds the nodes (rewrite/splits.py, emit.py)"
