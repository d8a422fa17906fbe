"""Tensors the step builds from host values become inputs of the step.

`z = torch.randn(batch, latent).to(device)` inside the step draws from the host's generator: capture
would run it once and every replay would reuse that noise. The rewrite evaluates the expression
before the step call instead, under a fresh name, and the step receives it as an input (copied into
its static buffer). That is the same training when nothing the expression reads is changed by the
step before it, and when nothing else in the step draws from a host generator, so that the draws keep
their order. The step's GPU work draws only from the device generator, which the host draws never touch.
"""

from __future__ import annotations

import libcst as cst

from graphify.analysis.checker import Finding, kwarg, removable
from graphify.analysis.calls import method_call
from graphify.analysis.statements import names_read, names_written, walk
from graphify.analysis.tree import children
from graphify.analysis.values import Env
from graphify.plan.base import Plan, ReplaceNodes
from graphify.plan.dataflow import RANDOM_FACTORIES as _RANDOM
from graphify.plan.names import fresh_name
from graphify.rules.allocation import HOST_DATA
from graphify.rules.devices import HOST_TENSOR_COPY, is_device_copy, legacy_tensor_type
from graphify.rules.rewrite_safety import HOST_RANDOM

# torch calls that build a new host tensor (or copy one) and change nothing else but the host generator
_BUILDERS = _RANDOM | {"tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "eye", "arange", "linspace", "Variable"}
_METHODS = {"to", "cuda", "type", "float", "double", "half", "long", "int", "bool", "view", "reshape", "unsqueeze", "contiguous", "size"}
_BUILTINS = {"len", "int", "float", "tuple", "list", "min", "max"}


def plan_draws(plan: Plan, body: list[cst.BaseStatement], findings: list[Finding], env: Env) -> None:
    """Fills plan.draws with the expressions of the captured statements to evaluate before the call."""
    span = range(plan.first, plan.last + 1)
    plain = {
        i for i in plan.graph if i in span and i not in plan.hoisted and i not in plan.keys and isinstance(body[i], cst.SimpleStatementLine)
    }
    ids = {i: _ids(body[i]) for i in plain}
    parents: dict[int, dict[int, cst.CSTNode]] = {}  # statement index -> its parent map, made once
    by_stmt: dict[int, list[cst.BaseExpression]] = {}
    for f in findings:
        if not ((f.rule is HOST_TENSOR_COPY or f.rule is HOST_DATA) and not removable(f)):
            continue
        index = next((i for i in plain if id(f.node) in ids[i]), None)
        if index is not None:
            up = parents.setdefault(index, _parents(body[index]))
            by_stmt.setdefault(index, []).append(_widen(up, f.node, env))
    if not by_stmt:
        return
    changed = set().union(*(names_written(body[i]) for i in span), *(names_written(body[i]) for i in plan.pulled_in))
    for index in sorted(by_stmt):
        outermost = [e for e in by_stmt[index] if not any(e is not o and id(e) in _ids(o) for o in by_stmt[index])]
        if len({id(e) for e in outermost}) != 1:
            continue  # two draws in one statement: their order of evaluation is not the order of the source
        expr = outermost[0]
        if names_read(expr) & changed or _conditionally_evaluated(parents[index], expr) or not _builds_only(expr, env):
            continue
        target = _assigned_name(body[index])
        plan.draws[id(expr)] = (f"{target or 'host'}_drawn", expr)
    if _draws_left_in_step(plan, body, env):
        plan.draws.clear()
        return
    taken = plan.loop.module.names
    plan.draws = {key: (fresh_name(base, taken), expr) for key, (base, expr) in plan.draws.items()}


def _ids(root: cst.CSTNode) -> set[int]:
    return {id(n) for n in walk(root)}


def _widen(parents: dict[int, cst.CSTNode], node: cst.CSTNode, env: Env) -> cst.CSTNode:
    """`torch.from_numpy(a).float().to(device)`: the conversions and device copy of a built tensor go with it."""
    widest = node
    while True:
        parent = parents.get(id(node))
        call = parents.get(id(parent)) if isinstance(parent, cst.Attribute) else None
        if not (isinstance(call, cst.Call) and call.func is parent and parent.attr.value in _METHODS):
            return widest
        node = call
        if is_device_copy(call, env):
            widest = call


def _parents(root: cst.CSTNode) -> dict[int, cst.CSTNode]:
    found, stack = {}, [root]
    while stack:
        n = stack.pop()
        for c in children(n):
            found[id(c)] = n
            stack.append(c)
    return found


def _builds_only(expr: cst.CSTNode, env: Env) -> bool:
    """Every call builds or converts a tensor from host values; random ones draw on the host."""
    for n in walk(expr):
        if isinstance(n, (cst.Lambda, cst.NamedExpr, cst.Await, cst.Yield)):
            return False
        if not isinstance(n, cst.Call):
            continue
        qual = env.qualify(n.func) or ""
        last = qual.rsplit(".", 1)[-1]
        if qual.startswith("torch.") and last in _BUILDERS:
            if last in _RANDOM and (kwarg(n, "device") is not None or kwarg(n, "generator") is not None):
                return False  # a device draw would move within the device generator's order
            continue
        if qual.startswith("numpy.") or legacy_tensor_type(n.func, env) or qual in _BUILTINS:
            continue
        m = method_call(n)
        if m is not None and m[1] in _METHODS and not qual.startswith("torch."):
            continue
        return False
    return True


def _conditionally_evaluated(parents: dict[int, cst.CSTNode], expr: cst.CSTNode) -> bool:
    node = expr
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, (cst.IfExp, cst.BooleanOperation, cst.BaseComp, cst.Lambda)):
            return True
    return False


def _draws_left_in_step(plan: Plan, body, env: Env) -> bool:
    """Whether the step draws from a host generator outside the expressions drawn before it (there, or
    in a statement moved out of the step): the draws would change order."""
    drawn = drawn_nodes(plan)
    for i in range(plan.first, plan.last + 1):
        for n in walk(body[i]):
            if isinstance(n, cst.Call) and id(n) not in drawn:
                qual = env.qualify(n.func) or ""
                if qual.startswith(HOST_RANDOM) or (qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in _RANDOM):
                    return True
    return False


def _assigned_name(stmt: cst.SimpleStatementLine) -> str | None:
    small = stmt.body[0] if len(stmt.body) == 1 else None
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        return small.targets[0].target.value
    return None


def replace_draws(plan: Plan, stmt: cst.BaseStatement) -> cst.BaseStatement:
    """The statement as the step runs it: each drawn expression replaced by its input's name."""
    if not plan.draws:
        return stmt
    return stmt.visit(ReplaceNodes({key: cst.Name(name) for key, (name, _) in plan.draws.items()}))


def drawn_nodes(plan: Plan) -> set[int]:
    """ids of every node inside the drawn expressions: they run before the step, not in it."""
    return {id(n) for _, expr in plan.draws.values() for n in walk(expr)}
