"""Files graphify has rewritten: the runtime helpers they bind (their loops are captured already)."""

from __future__ import annotations

import libcst as cst

from graphify.analysis.calls import _iter_nodes_all
from graphify.analysis.program import ModuleInfo

# What rewrites call, imported from graphify.runtime, from a vendored copy, or pasted inline.
RUNTIME_HELPERS = ("CapturedStep", "GraphedModule")
INLINE_FUNCTION = "_graphify_runtime"  # the function a runtime pasted into a file lives in
VENDOR_MARK = '"""graphify runtime '  # how a vendored runtime module (of any version) starts


def is_vendored_runtime(source: str) -> bool:
    """graphify's own runtime, written for a project: not the user's code to check."""
    return source.lstrip("\ufeff").startswith(VENDOR_MARK)


def in_pasted_runtime(ancestors) -> bool:
    """Inside the runtime `--runtime inline` pasted into the file: not the user's code to check."""
    return any(isinstance(a, cst.FunctionDef) and a.name.value == INLINE_FUNCTION for a in ancestors)


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
