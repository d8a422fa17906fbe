"""Scripts that capture CUDA graphs themselves: which of their loops warm up or replay a graph (their
verdict is `already-captured`), and which are ordinary loops beside them, analysed as any other."""

from __future__ import annotations

import libcst as cst

from graphify.analysis.calls import _is_step_like, _iter_nodes
from graphify.analysis.program import FunctionInfo, ModuleInfo
from graphify.analysis.tree import children, memo

CAPTURED, SKIPPED = "captured", "skipped"
_CAPTURE_CONTEXTS = ("torch.cuda.stream", "torch.cuda.graph")
_NOT_OWN = frozenset({cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda})  # exact types, as calls._SKIP


def hand_capture_role(module: ModuleInfo, func: FunctionInfo, loop: cst.For | cst.While, ancestors, captured_steps) -> str | None:
    """CAPTURED: a loop that warms up a graph on a side stream, runs inside a capture, or replays a graph
    (`g.replay()`, a callable made by `make_graphed_callables`) in a function that captures by hand.
    SKIPPED: code graphify leaves alone (the step function of a `CapturedStep`, side-stream work of a
    function that captures nothing). None: an ordinary loop."""
    if func.node is not None and func.node.name.value in captured_steps:
        return SKIPPED  # the step function of a loop `graphify rewrite` already captured
    captures = captures_by_hand(_body(func, module))
    if any(_opens_capture_context(a, module) for a in ancestors):
        return CAPTURED if captures else SKIPPED
    if captures and _replays(loop, func, module):
        return CAPTURED
    return None


def captured_kind(func: FunctionInfo, module: ModuleInfo) -> str:
    """A graph the function captures trains when the function runs a backward or an optimizer step."""
    return "train" if any(_is_step_like(n) for n in _iter_nodes(_body(func, module))) else "inference"


def _body(func: FunctionInfo, module: ModuleInfo) -> cst.CSTNode:
    return func.node.body if func.node is not None else module.tree


_CAPTURES: dict[int, tuple[cst.CSTNode, bool]] = memo()


def captures_by_hand(body: cst.CSTNode) -> bool:
    """Whether the body uses `CUDAGraph` or `make_graphed_callables`; walked once per body, not per loop."""
    found = _CAPTURES.get(id(body))
    if found is None or found[0] is not body:
        uses = any(isinstance(n, cst.Attribute) and n.attr.value in ("CUDAGraph", "make_graphed_callables") for n in _iter_nodes(body))
        found = _CAPTURES[id(body)] = (body, uses)
    return found[1]


def _opens_capture_context(node: cst.CSTNode, module: ModuleInfo) -> bool:
    if not isinstance(node, cst.With):
        return False
    items = [i.item.func if isinstance(i.item, cst.Call) else i.item for i in node.items]
    return any((module.aliases.qualify(item) or "").startswith(_CAPTURE_CONTEXTS) for item in items)


def _replays(loop: cst.For | cst.While, func: FunctionInfo, module: ModuleInfo) -> bool:
    """The loop itself replays (an epoch loop around a replay loop does not: the inner loop is the step's)."""
    graphed = _graphed_names(func, module)
    for n in _own_nodes(loop.body):
        if not isinstance(n, cst.Call):
            continue
        if isinstance(n.func, cst.Attribute) and n.func.attr.value == "replay" and not n.args:
            return True
        if isinstance(n.func, cst.Name) and n.func.value in graphed:
            return True
    return False


def _graphed_names(func: FunctionInfo, module: ModuleInfo) -> set[str]:
    """Names bound to what `torch.cuda.make_graphed_callables(...)` returns."""
    found = set()
    for scope in (func.scope, module.scope):
        for name, values in scope.values.items():
            for value in values:
                call = value.value if isinstance(value, cst.Subscript) else value  # `a, b = make_graphed_callables(...)`
                if isinstance(call, cst.Call) and (module.aliases.qualify(call.func) or "").endswith("make_graphed_callables"):
                    found.add(name)
    return found


def _own_nodes(node: cst.CSTNode):
    """The nodes under `node`, not entering nested loops, functions or classes."""
    stack = list(children(node))
    while stack:
        n = stack.pop()
        yield n
        if type(n) not in _NOT_OWN:
            stack.extend(children(n))
