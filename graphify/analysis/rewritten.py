"""Files graphify has rewritten: the runtime helpers they bind (their loops are captured already)."""

from __future__ import annotations

import libcst as cst

from graphify.analysis.calls import _iter_nodes_all
from graphify.analysis.program import ModuleInfo

# What rewrites call, imported from graphify.runtime, from a vendored copy, or pasted inline.
RUNTIME_HELPERS = ("CapturedStep", "GraphedModule")


def runtime_helper_assignments(module: ModuleInfo) -> list[tuple[str, cst.BaseExpression | None]]:
    """(name bound, what it wraps) for each `x = CapturedStep(f)` or `x = GraphedModule(m)` of a module,
    the runtime's classes however they are imported."""
    found = []
    for n in _iter_nodes_all(module.tree):
        if (
            type(n) is cst.Assign
            and isinstance(n.value, cst.Call)
            and isinstance(n.targets[0].target, cst.Name)
            and is_runtime_helper(n.value.func, module)
        ):
            found.append((n.targets[0].target.value, n.value.args[0].value if n.value.args else None))
    return found


def is_runtime_helper(func: cst.BaseExpression, module: ModuleInfo) -> bool:
    return (module.aliases.qualify(func) or "").rsplit(".", 1)[-1] in RUNTIME_HELPERS
