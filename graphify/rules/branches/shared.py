"""What the data-dependent-branch rules share: whether a host expression depends on a tensor's value."""

import libcst as cst

from graphify.analysis.calls import iter_nodes, method_call
from graphify.analysis.names import dotted

_READS = ("item", "tolist")
_CASTS = ("float", "int", "bool")


def reads_tensor_value(expr: cst.BaseExpression, env, depth: int = 0) -> bool:
    """Does a host expression depend on a tensor's value (`loss.item()`, `float(t)`, a name bound
    to one): `if not math.isfinite(loss_value):` decides on the GPU's result."""
    if depth > 3:
        return False
    for n in iter_nodes(expr):
        m = method_call(n)
        if m is not None and m[1] in _READS and env.is_tensor(m[0]):
            return True
        if (
            isinstance(n, cst.Call)
            and isinstance(n.func, cst.Name)
            and n.func.value in _CASTS
            and n.args
            and env.is_tensor(n.args[0].value)
        ):
            return True
        name = dotted(n) if isinstance(n, cst.Name) else None
        if name and any(reads_tensor_value(v, env, depth + 1) for v in env.values_of(name)):
            return True
    return False
