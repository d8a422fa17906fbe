"""Tensors the step builds from host values become inputs of the step.

`z = torch.randn(batch, latent).to(device)` inside the step draws from the host's generator: capture
would run it once and every replay would reuse that noise. The rewrite evaluates the expression
before the step call instead, under a fresh name, and the step receives it as an input (copied into
its static buffer). That is the same training when nothing the expression reads is changed by the
step before it, and when nothing else in the step draws from a host generator, so that the draws keep
their order. The step's GPU work draws only from the device generator, which the host draws never touch.

Batches taken with `next(it)` are inputs too: before the call where nothing of the step runs before the
fetch; through `CapturedStep.fetch` where each pass of a micro-step loop takes one, since there the
fetches interleave with the passes' work (a CPU run's dropout shares the host generator with them).
"""

from __future__ import annotations

import libcst as cst

from graphify.analysis.checker import Finding, kwarg, removable
from graphify.analysis.calls import method_call
from graphify.analysis.devices import is_device_copy, legacy_tensor_type
from graphify.analysis.randomness import HOST_RANDOM, RANDOM_FACTORIES as _RANDOM
from graphify.analysis.statements import contains, names_read, names_written, walk
from graphify.analysis.tree import children
from graphify.analysis.values import Env
from graphify.model import FixKind
from graphify.plan.base import Plan, fresh_name

# torch calls that build a new host tensor (or copy one) and change nothing else but the host generator
_BUILDERS = _RANDOM | {"tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "eye", "arange", "linspace", "Variable"}
_METHODS = {"to", "cuda", "type", "float", "double", "half", "long", "int", "bool", "view", "reshape", "unsqueeze", "contiguous", "size"}
_BUILTINS = {"len", "int", "float", "tuple", "list", "min", "max", "next"}


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
        if not (f.rule.fix.kind in (FixKind.ON_DEVICE, FixKind.DRAWN) and not removable(f)):
            continue
        index = next((i for i in plain if id(f.node) in ids[i]), None)
        if index is not None:
            up = parents.setdefault(index, _parents(body[index]))
            by_stmt.setdefault(index, []).append(_widen(up, f.node, env))
    statements = {index: body[index] for index in by_stmt}
    repeats: dict[int, tuple[cst.BaseExpression, str]] = {}  # a statement of a micro-step loop -> (its count, index)
    for place, stmt, fetches, repeat in _fetches(plan, body, plain, env):
        up = parents.setdefault(place, _parents(stmt))
        by_stmt.setdefault(place, []).extend(_widen(up, call, env) for call in fetches)
        statements[place] = stmt
        if repeat is not None:
            repeats[place] = repeat
    if not by_stmt:
        return
    changed = set().union(*(names_written(body[i]) for i in span), *(names_written(body[i]) for i in plan.pulled_in))
    for place in sorted(by_stmt):
        expr = _outermost(by_stmt[place])
        if expr is None:
            continue  # two draws in one statement: their order of evaluation is not the order of the source
        if names_read(expr) & changed or _conditionally_evaluated(parents[place], expr) or not _builds_only(expr, env):
            continue
        plan.draws[id(expr)] = (f"{_input_base(statements[place], expr, place in repeats, env)}_drawn", expr)
        if place in repeats:
            plan.draw_repeats[id(expr)] = repeats[place]
    drawn = [place for place in sorted(by_stmt) if id(_outermost(by_stmt[place])) in plan.draws]
    per_pass = [place for place in drawn if place in repeats]
    loops = [int(place) for place in per_pass]
    if (
        any(loops.count(i) > 1 for i in loops)  # two draws per pass, drawn k at a time, would interleave differently
        # the batches of micro-steps are fetched during the call (or at its start), the other draws before it
        or (per_pass and any(place > per_pass[0] for place in drawn if place not in repeats))
        or _draws_left_in_step(plan, body, env)
    ):
        plan.draws.clear()
        plan.draw_repeats.clear()
        return
    plan.fetches = [call for _, expr in plan.draws.values() for call in _next_calls(expr, env)]
    taken = plan.loop.module.names
    plan.draws = {key: (fresh_name(base, taken), expr) for key, (base, expr) in plan.draws.items()}


def _outermost(exprs: list[cst.BaseExpression]) -> cst.BaseExpression | None:
    """The one draw of a statement that holds the others, or None when it holds two apart."""
    outermost = [e for e in exprs if not any(e is not o and id(e) in _ids(o) for o in exprs)]
    return outermost[0] if len({id(e) for e in outermost}) == 1 else None


def _fetches(plan: Plan, body, plain: set[int], env: Env):
    """`next(loader)` in the step: (place, statement, its next() calls, repeat). A batch fetched before
    anything else of the step runs is drawn like a host tensor; one fetched in each pass of a micro-step
    loop (`for _ in range(k): loss = model(next(loader))`) is handed to the runtime's `fetch` (in pass
    order while the step runs eagerly, all k before a replay), and pass `i` reads the i-th (repeat: the
    loop's count and index name). Places of a micro-step loop's statements are fractional, after the
    loop's own index, so that draws keep source order."""
    for i in range(plan.first, plan.last + 1):
        if i in plain:
            # fetched ahead of the step's own work: on a CPU the host generator serves both
            fetches = [c for c in _next_calls(body[i], env) if i == plan.first and _evaluated_first(body[i], c)]
            yield i, body[i], fetches, None
        elif i not in plan.hoisted and i not in plan.keys and (repeat := _micro_step_loop(body[i], env)) is not None:
            for k, stmt in enumerate(body[i].body.body):
                if isinstance(stmt, cst.SimpleStatementLine):
                    yield i + (k + 1) / (len(body[i].body.body) + 1), stmt, _next_calls(stmt, env), repeat


def _next_calls(stmt: cst.CSTNode, env: Env) -> list[cst.Call]:
    return [
        n
        for n in walk(stmt)
        if isinstance(n, cst.Call) and (env.qualify(n.func) or "") == "next" and len(n.args) == 1 and n.args[0].keyword is None
    ]


def _evaluated_first(stmt: cst.CSTNode, call: cst.Call) -> bool:
    """Whether no call of `stmt` runs before `call` but the calls that hold it (`model(next(it))`): the
    source order, which is Python's order of evaluation for the arguments and values of a statement."""
    for n in _preorder(stmt):
        if n is call:
            return True
        if isinstance(n, cst.Call) and not contains(n, call):
            return False
    return False


def _preorder(node: cst.CSTNode):
    yield node
    for c in children(node):
        yield from _preorder(c)


def _micro_step_loop(stmt: cst.BaseStatement, env: Env) -> tuple[cst.BaseExpression, str] | None:
    """`for i in range(k):` that runs its whole body k times (no `break`, `continue`, `return` or
    `else`) and never rebinds `i`: (k, "i")."""
    if not (isinstance(stmt, cst.For) and stmt.orelse is None and isinstance(stmt.target, cst.Name)):
        return None
    it = stmt.iter
    if not (isinstance(it, cst.Call) and (env.qualify(it.func) or "") == "range" and len(it.args) == 1 and it.args[0].keyword is None):
        return None
    if not isinstance(stmt.body, cst.IndentedBlock) or stmt.target.value in set().union(*(names_written(s) for s in stmt.body.body)):
        return None
    if any(isinstance(n, (cst.Break, cst.Continue, cst.Return, cst.Yield, cst.Raise)) for n in walk(stmt.body)):
        return None
    return it.args[0].value, stmt.target.value


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


def _input_base(stmt: cst.SimpleStatementLine, expr: cst.BaseExpression, repeated: bool, env: Env) -> str:
    """The name the drawn value takes: the variable it is assigned to (`z = torch.randn(...)`), else
    what it is (`model(next(loader))`: a batch)."""
    small = stmt.body[0] if len(stmt.body) == 1 else None
    if isinstance(small, cst.Assign) and small.value is expr and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        return small.targets[0].target.value + ("_each" if repeated else "")
    if _next_calls(expr, env):
        return "batches" if repeated else "batch"
    return "host"


def drawn_names(plan: Plan) -> dict[int, tuple[str, ...]]:
    """What the step reads in place of each drawn expression (by id): its input, or the pass's item of it
    (`batch_each[k]`: the input and the micro-step loop's index)."""
    return {key: (name,) if key not in plan.draw_repeats else (name, plan.draw_repeats[key][1]) for key, (name, _) in plan.draws.items()}


def drawn_nodes(plan: Plan) -> set[int]:
    """ids of every node inside the drawn expressions: they run before the step, not in it."""
    return {id(n) for _, expr in plan.draws.values() for n in walk(expr)}
