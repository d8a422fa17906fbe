"""data-dependent-branch: Python control flow decided by a tensor's value."""

import libcst as cst

from graphify.analysis.calls import iter_nodes, method_call
from graphify.analysis.checker import code_of
from graphify.analysis.names import dotted
from graphify.rules.registry import rule

IF_TENSOR = rule(
    "GFY101",
    "tensor-condition",
    "data-dependent-branch",
    "error",
    "`if`/`while` on a tensor value: the graph records only the branch taken at capture",
    False,
)
ASSERT_TENSOR = rule(
    "GFY102", "tensor-assert", "data-dependent-branch", "error", "`assert` on a tensor value syncs, and is not re-checked on replay", False
)
BOOL_OP_TENSOR = rule(
    "GFY103",
    "tensor-boolean-expression",
    "data-dependent-branch",
    "error",
    "a conditional expression, `and`/`or`/`not` or `min`/`max` over tensor values",
    False,
)

RULES = (IF_TENSOR, ASSERT_TENSOR, BOOL_OP_TENSOR)


_CONDITION_PARENTS = (cst.If, cst.While, cst.Assert, cst.IfExp)


def check(ck):
    for node, site in ck.nodes():
        env = site.env
        if isinstance(node, (cst.If, cst.While)) and env.is_tensor(node.test):
            yield ck.finding(
                IF_TENSOR,
                node,
                site,
                f"branch on tensor value `{code_of(node.test)}`",
                "compute both sides and select with `torch.where`, or use `torch.cond`; or move the check after the step",
            )
        elif isinstance(node, (cst.If, cst.While, cst.Assert)) and _reads_tensor_value(node.test, env):
            yield ck.finding(
                IF_TENSOR,
                node,
                site,
                f"branch on `{code_of(node.test)}`, a value read from a tensor on the host",
                "check after the step, outside the captured region, or keep the test on the device (`torch.where`)",
            )
        elif isinstance(node, cst.Assert) and env.is_tensor(node.test):
            yield ck.finding(
                ASSERT_TENSOR,
                node,
                site,
                f"assert on tensor value `{code_of(node.test)}`",
                "check after the step (outside the captured region), or drop the assert in the hot loop",
            )
        elif isinstance(node, cst.IfExp) and env.is_tensor(node.test):
            yield ck.finding(
                BOOL_OP_TENSOR,
                node,
                site,
                f"conditional expression on tensor value `{code_of(node.test)}`",
                "use `torch.where(cond, a, b)`",
            )
        elif isinstance(node, cst.BooleanOperation) and not _in_condition(site):
            if env.is_tensor(node.left) or env.is_tensor(node.right):
                yield ck.finding(
                    BOOL_OP_TENSOR,
                    node,
                    site,
                    f"`and`/`or` on tensor values in `{code_of(node)}`",
                    "use `torch.logical_and`/`logical_or` or `&`/`|`",
                )
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ("max", "min") and len(node.args) >= 2:
            if any(env.is_tensor(a.value) for a in node.args):
                yield ck.finding(
                    BOOL_OP_TENSOR,
                    node,
                    site,
                    f"Python `{node.func.value}()` compares tensor values in `{code_of(node)}`",
                    f"use `torch.{node.func.value}imum(a, b)`",
                )


_READS = ("item", "tolist")
_CASTS = ("float", "int", "bool")


def _reads_tensor_value(expr: cst.BaseExpression, env, depth: int = 0) -> bool:
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
        if name and any(_reads_tensor_value(v, env, depth + 1) for v in env.values_of(name)):
            return True
    return False


def _in_condition(site):
    return any(isinstance(a, _CONDITION_PARENTS) for a in site.ancestors)
