"""How one loop is rewritten: which statements become the captured step, what moves around it.

The loop body splits into: statements before the step (kept, eager), the step (from the first
model call to the last backward/optimizer step), and statements after it (kept, eager). Inside the
step, host-only statements (logging, `.item()` reads, LR updates) move out, before or after the
call; `GradScaler.step/update` and what follows stay eager after the call; host conditions such as
`(i + 1) % accum == 0` become the key that picks one graph per branch outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from graphify.analysis.checker import kwarg
from graphify.analysis.discovery import (
    Loop,
    is_backward,
    is_model_call,
    is_step_op,
    method_call,
)
from graphify.analysis.engine import LoopAnalysis, removable
from graphify.analysis.names import dotted
from graphify.analysis.statements import (
    contains,
    does_gpu_work,
    is_host_read_call,
    names_read,
    names_written,
    walk,
)
from graphify.analysis.tree import children
from graphify.analysis.values import OPTIMIZER, SCALER, Env
from graphify.model import Rule
from graphify.rewrite import dataflow
from graphify.rewrite.names import fresh_name
from graphify.rules.rewrite_safety import HOST_BRANCH_IN_STEP, LOOP_SHAPE, PER_STEP_HOST_VALUE

# Breakers the rewrite fixes where they stand, inside the captured step.
FIXED_IN_PLACE = {"GFY401", "GFY251", "GFY422", "GFY501", "GFY411", "GFY412"}
_SHAPE_METHODS = {"size", "dim", "numel"}


_EMPTY = cst.Module([])


class Refusal(Exception):
    """Why a loop is not rewritten: a rule code, a message, and where (None: the loop itself)."""

    def __init__(self, rule: Rule, message: str, node: cst.CSTNode | None = None) -> None:
        super().__init__(message)
        self.rule, self.node = rule, node

    @property
    def reason(self) -> str:
        return self.rule.code


def _refuse(rule: Rule, node: cst.CSTNode | None, message: str) -> None:
    raise Refusal(rule, message, node)


@dataclass
class Plan:
    loop: Loop
    kind: str
    first: int  # body index of the first statement of the step
    last: int  # body index of the last statement of the step (inclusive)
    graph: list[int] = field(default_factory=list)  # body indexes captured
    before: list[int] = field(default_factory=list)  # step statements moved before the call
    after: list[int] = field(default_factory=list)  # step statements moved after the call
    split_ifs: dict[int, list[int]] = field(default_factory=dict)  # keyed if -> host statements of its body, run after
    tail: list[int] = field(default_factory=list)  # eager statements after the call (GradScaler)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    clones: list[str] = field(default_factory=list)
    optimizers: list[cst.BaseExpression] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)  # body indexes of keyed ifs
    device: cst.BaseExpression | None = None  # where host inputs go, for `.to(device)` inside the step
    autocast_calls: list[cst.Call] = field(default_factory=list)
    zero_grads: list[cst.Call] = field(default_factory=list)
    # `correct += (model(x).argmax(1) == y).sum().item()`: the tensor is computed in the graph,
    # the host read runs after the replay. index -> (captured statement, host statement)
    hoisted: dict[int, tuple[cst.BaseStatement, cst.BaseStatement]] = field(default_factory=dict)
    hoisted_reads: set[int] = field(default_factory=set)  # ids of the host-read calls moved out
    pulled_in: list[int] = field(default_factory=list)  # statements before `first` moved into the step


def body_of(loop: Loop) -> list[cst.BaseStatement]:
    body = loop.node.body
    return list(body.body) if isinstance(body, cst.IndentedBlock) else []


def make_plan(analysis: LoopAnalysis, enclosing: cst.CSTNode) -> Plan:
    """`enclosing` is the function (or module) that holds the loop."""
    loop = analysis.loop
    if loop.node.orelse is not None:
        raise Refusal(LOOP_SHAPE, "loops with an `else:` clause are not rewritten")
    body = body_of(loop)
    env = loop.region.body_block.env
    step_calls, model_calls = _calls_into_step(loop)
    env.gpu_calls = step_calls | model_calls

    def holds(stmt, test, via):
        return any(isinstance(n, cst.Call) and (test(n, env) or id(n) in via) for n in walk(stmt))

    if loop.kind == "train":
        anchors = [i for i, s in enumerate(body) if holds(s, is_step_op, step_calls)]
    else:
        anchors = [i for i, s in enumerate(body) if holds(s, is_model_call, model_calls)]
    # a periodic branch before the step (evaluation every N steps) runs eagerly between replays
    starts = [i for i, s in enumerate(body) if holds(s, is_model_call, model_calls | step_calls)
              and (i in anchors or loop.kind != "train" or not _is_periodic_branch(s, env, step_calls))]
    if not anchors or not starts:
        raise Refusal(LOOP_SHAPE, "the step is not in the loop body")
    plan = Plan(loop, loop.kind, first=min(starts[0], anchors[0]), last=anchors[-1])
    _split_step(plan, body, env)
    _pull_in_zero_grad(plan, body, env)
    dataflow.check_captured_code(plan, body, _refuse)
    _check_breakers(plan, analysis, body)
    _find_inputs_outputs(plan, body, env, enclosing)
    dataflow.check_loop_mutations(plan, body, _refuse)
    for i in sorted(plan.after):
        dataflow.check_moved_statement(plan, body, i, _refuse)
    return plan


def rebound_in_loop(loop: Loop) -> set[str]:
    """Names bound anywhere in the outermost loop (of the same function) around the step's loop:
    the step function is defined before it, so each of them may differ from one step to the next."""
    outer = loop.node
    for a in reversed(loop.ancestors):
        if isinstance(a, (cst.FunctionDef, cst.ClassDef)):
            break
        if isinstance(a, (cst.For, cst.While)):
            outer = a
    return names_written(outer)


def _calls_into_step(loop: Loop) -> tuple[set[int], set[int]]:
    """Calls in the loop body that run a backward/optimizer step, or a model, inside a called function."""
    steps, models = set(), set()
    region = loop.region
    for node, site in region.nodes:
        if site.block is region.body_block or not isinstance(node, cst.Call):
            continue
        call = region.body_call_of(site)
        if call is None:
            continue
        if is_step_op(node, site.env):
            steps.add(id(call))
        elif is_model_call(node, site.env):
            models.add(id(call))
    return steps, models


def _split_step(plan: Plan, body: list[cst.BaseStatement], env: Env) -> None:
    span = list(range(plan.first, plan.last + 1))
    # GradScaler.step/update (and unscaling, clipping between them) run eagerly after the replay.
    for i in span:
        if any(_is_scaler_call(n, env) for n in walk(body[i])):
            if not any(isinstance(n, cst.Call) and is_backward(n, env) for j in span if j < i for n in walk(body[j])):
                raise Refusal(LOOP_SHAPE, "GradScaler step comes before the backward pass", body[i])
            plan.tail = [j for j in span if j >= i]
            span = [j for j in span if j < i]
            break
    graph_writes: set[str] = set()
    rebound = rebound_in_loop(plan.loop)
    for pos, i in enumerate(span):
        stmt = body[i]
        _hoist_host_reads(plan, i, stmt, env)
        if i in plan.hoisted:
            plan.graph.append(i)
            graph_writes |= names_written(plan.hoisted[i][0])
            continue
        later_reads = set().union(*(names_read(body[j]) for j in span[pos + 1:])) if pos + 1 < len(span) else set()
        writes = names_written(stmt)
        if does_gpu_work(stmt, env):
            if _is_side_computation(stmt, env) and not writes & later_reads:
                # `total_loss += loss.detach()`: nothing in the step needs it, so it runs after the call
                plan.after.append(i)
                continue
            plan.graph.append(i)
            graph_writes |= writes
            if isinstance(stmt, cst.If):
                _plan_keyed_if(plan, i, stmt, env)
            continue
        if writes & later_reads:
            varying = {n for n in (names_read(stmt) & rebound) - graph_writes if not _is_shape_value(n, body)}
            if _has_side_effects(stmt) or varying:
                why = f"reads `{sorted(varying)[0]}`, which changes between steps" if varying else "calls code with possible side effects"
                raise Refusal(PER_STEP_HOST_VALUE, f"a host statement the step needs {why}; capture would run it once", stmt)
            plan.graph.append(i)  # a host value the step needs (a shape, a constant): computed once at capture
            graph_writes |= writes
        elif names_read(stmt) & graph_writes or not _sets_lr(stmt):
            plan.after.append(i)
        else:
            plan.before.append(i)
    if not any(isinstance(n, cst.Call) and (is_step_op(n, env) or is_model_call(n, env) or id(n) in env.gpu_calls)
               for i in plan.graph for n in walk(body[i])):
        raise Refusal(LOOP_SHAPE, "nothing left to capture")
    for i in plan.graph:
        for n in walk(body[i]):
            if isinstance(n, cst.WithItem) and _is_autocast(n, env):
                plan.autocast_calls.append(n.item)
            if plan.keys and _is_zero_grad(n):
                plan.zero_grads.append(n)
    region = plan.loop.region
    graph_nodes = [body[i] for i in plan.graph]
    for node, site in region.nodes:
        m = method_call(node)
        if m is None or m[1] != "step" or not is_step_op(node, site.env) or site.env.kind_of(m[0]) != OPTIMIZER:
            continue
        if not any(contains(s, _body_node_of(plan, node)) for s in graph_nodes):
            continue
        optimizer = _in_loop_scope(plan, m[0], site.block)  # the runtime finds the optimizers itself
        if optimizer is not None and not any(_same(optimizer, o) for o in plan.optimizers):
            plan.optimizers.append(optimizer)


def _pull_in_zero_grad(plan: Plan, body: list[cst.BaseStatement], env: Env) -> None:
    """`optimizer.zero_grad()` shortly before the step moves into the step. Captured, it only hands
    the gradients to the graph's pool, which every replay refills in place; left outside, it would
    cost a Python call per step and leave `.grad` unset after each replay. Statements between it and
    the step (batch preparation) must not touch gradients."""
    if plan.keys:  # gradient accumulation: the keyed branches zero the gradients
        return
    for i in range(plan.first - 1, -1, -1):
        stmt = body[i]
        calls = [n for n in walk(stmt) if isinstance(n, cst.Call)]
        zero = [c for c in calls if _is_zero_grad(c)]
        if zero and isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr) \
                and stmt.body[0].value is zero[0]:
            plan.graph.insert(0, i)
            plan.pulled_in.append(i)
            return
        if zero or any(is_step_op(c, env) or id(c) in env.gpu_calls for c in calls) or any(
                isinstance(n, cst.Attribute) and n.attr.value == "grad" for n in walk(stmt)):
            return


class _Replace(cst.CSTTransformer):
    def __init__(self, replacements: dict[int, cst.BaseExpression]) -> None:
        self.replacements = replacements

    def on_leave(self, original, updated):
        return self.replacements.get(id(original), updated)


def _hoist_host_reads(plan: Plan, index: int, stmt: cst.BaseStatement, env: Env) -> None:
    """Split `total += step_tensor_expression.item()` into a captured assignment and a host read."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return
    small = stmt.body[0]
    if not isinstance(small, (cst.Assign, cst.AugAssign, cst.Expr)):
        return
    reads = []
    stack = [small]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Call) and is_host_read_call(n, env):
            m = method_call(n)
            receiver = m[0] if m is not None and m[1] in ("item", "tolist", "numpy", "cpu") else (n.args[0].value if n.args else None)
            if receiver is not None and does_gpu_work(receiver, env):
                reads.append((n, receiver))
                continue
        stack.extend(children(n))
    if not reads:
        return
    target = small.target if isinstance(small, cst.AugAssign) else small.targets[0].target if isinstance(small, cst.Assign) else None
    base = f"{target.value}_tensor" if isinstance(target, cst.Name) else "step_tensor"
    names = [fresh_name(base, plan.loop.module.names) for _ in reads]
    captured = cst.parse_statement(f"{', '.join(names)} = {', '.join(_EMPTY.code_for_node(r) for _, r in reads)}")
    host = stmt.visit(_Replace({id(r): cst.Name(name) for (_, r), name in zip(reads, names)}))
    plan.hoisted[index] = (captured.with_changes(leading_lines=stmt.leading_lines), host.with_changes(leading_lines=[]))
    plan.hoisted_reads.update(id(call) for call, _ in reads)


def _is_periodic_branch(stmt: cst.BaseStatement, env: Env, step_calls: set[int]) -> bool:
    """`if step % k == 0:` holding evaluation (model calls, no backward or optimizer step)."""
    return isinstance(stmt, cst.If) and env._tensor(stmt.test, 0) is not True and not any(
        isinstance(n, cst.Call) and (is_step_op(n, env) or is_backward(n, env) or id(n) in step_calls) for n in walk(stmt))


def _is_side_computation(stmt: cst.BaseStatement, env: Env) -> bool:
    """A plain (re)binding of names that neither runs the model nor steps, e.g. a metric accumulator,
    or the next batch fetched while the step runs (`X, Y = get_batch("train")`)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or not all(isinstance(s, (cst.Assign, cst.AugAssign)) for s in stmt.body):
        return False
    targets = [t.target for s in stmt.body for t in (s.targets if isinstance(s, cst.Assign) else [s])]
    targets = [t.target if isinstance(t, cst.AssignTarget) else t for t in targets]
    targets = [e.value for t in targets for e in (t.elements if isinstance(t, (cst.Tuple, cst.List)) else [cst.Element(t)])]
    if not all(isinstance(t, cst.Name) for t in targets):
        return False
    return not any(
        isinstance(n, cst.Call) and (is_step_op(n, env) or is_model_call(n, env) or id(n) in env.gpu_calls or _mutates(n))
        for n in walk(stmt)
    )


def _mutates(call: cst.Call) -> bool:
    m = method_call(call)
    return m is not None and m[1].endswith("_") and not m[1].startswith("_")


def _plan_keyed_if(plan: Plan, index: int, stmt: cst.If, env: Env) -> None:
    if env._tensor(stmt.test, 0) is True:
        return
    if stmt.orelse is not None:
        raise Refusal(HOST_BRANCH_IN_STEP, "a host branch with `else` inside the step", stmt)
    if not isinstance(stmt.body, cst.IndentedBlock):
        raise Refusal(HOST_BRANCH_IN_STEP, "a one-line host branch inside the step", stmt)
    plan.keys.append(index)
    host = [k for k, s in enumerate(stmt.body.body) if not does_gpu_work(s, env)]
    if host:
        plan.split_ifs[index] = host


def _is_scaler_call(node: cst.CSTNode, env: Env) -> bool:
    m = method_call(node)
    return m is not None and m[1] in ("step", "update", "unscale_") and env.kind_of(m[0]) == SCALER


def _is_zero_grad(node: cst.CSTNode) -> bool:
    m = method_call(node)
    return m is not None and m[1] == "zero_grad"


def _is_autocast(item: cst.WithItem, env: Env) -> bool:
    return isinstance(item.item, cst.Call) and (env.qualify(item.item.func) or "").endswith("autocast")


def _sets_lr(stmt: cst.CSTNode) -> bool:
    for n in walk(stmt):
        if isinstance(n, cst.SimpleString) and n.value.strip("'\"") == "lr":
            return True
    return False


def _has_side_effects(stmt: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Call) and not _is_shape_read(n) for n in walk(stmt))


def _is_shape_read(call: cst.Call) -> bool:
    m = method_call(call)
    return (m is not None and m[1] in _SHAPE_METHODS) or (isinstance(call.func, cst.Name) and call.func.value in ("len", "int", "float", "min", "max"))


def _same(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return a.deep_equals(b)


def _line(plan: Plan, node: cst.CSTNode) -> int:
    try:
        return plan.loop.module.position(node).start.line
    except KeyError:
        return plan.loop.module.position(plan.loop.node).start.line


def _check_breakers(plan: Plan, analysis: LoopAnalysis, body: list[cst.BaseStatement]) -> None:
    captured = [body[i] for i in plan.graph]
    for f in analysis.all_findings:
        if (f.rule.code in FIXED_IN_PLACE and removable(f)) or id(f.node) in plan.hoisted_reads:
            continue
        anchor = _body_node_of(plan, f.node)
        if not removable(f):
            # a breaker in a statement that stays outside the step runs eagerly, where it stands; the
            # fixed-in-place rules and dynamic shapes describe the captured step wherever they are reported
            if f.rule.code not in FIXED_IN_PLACE and f.rule.category != "dynamic-shape" and any(contains(s, anchor) for s in body) \
                    and not any(contains(s, anchor) for s in captured):
                continue
            raise Refusal(f.rule, f.message, f.node)
        if f.rule.code == "GFY301" and any(contains(body[i], anchor) for i in plan.graph):
            # An input copied inside the step: CapturedStep moves host inputs to `device` first,
            # which turns the copy into a no-op.
            device = _device_in_loop_scope(plan, f.node)
            if device is None:
                raise Refusal(f.rule, "cannot tell which device inputs go to", f.node)
            plan.device = plan.device or device
            continue
        in_graph = [s for s in captured if contains(s, anchor)]
        if not in_graph:
            continue
        if anchor is not f.node:
            raise Refusal(f.rule, f"{f.message} (inside a function the step calls)", f.node)
        stmt = in_graph[0]
        index = body.index(stmt)
        moved = plan.split_ifs.get(index, [])
        if not any(contains(stmt.body.body[k], f.node) for k in moved) if index in plan.split_ifs else True:
            raise Refusal(f.rule, f"{f.message} (would stay inside the captured step)", f.node)


def _body_node_of(plan: Plan, node: cst.CSTNode) -> cst.CSTNode:
    """The node itself when it is in the loop body, else the body's call that leads to it."""
    region = plan.loop.region
    site = next((st for n, st in region.nodes if n is node), None)
    if site is None or site.block is region.body_block:
        return node
    return region.body_call_of(site) or node


def _device_in_loop_scope(plan: Plan, call: cst.Call) -> cst.BaseExpression | None:
    """The device a `.to(device)` inside the step names, as an expression valid in the loop's scope."""
    region = plan.loop.region
    site = next((st for n, st in region.nodes if n is call), None)
    if site is None or not isinstance(call.func, cst.Attribute):
        return None
    if call.func.attr.value == "cuda":
        return cst.SimpleString('"cuda"')
    expr = kwarg(call, "device") or (call.args[0].value if call.args and call.args[0].keyword is None else None)
    return _in_loop_scope(plan, expr, site.block)


def _in_loop_scope(plan: Plan, expr: cst.BaseExpression | None, block) -> cst.BaseExpression | None:
    """`expr`, written in a function the step calls, as an expression valid in the loop's scope:
    parameters are traced back to their call-site arguments, `self.x` to `obj.x` for `obj.method()`."""
    region = plan.loop.region
    while expr is not None and block is not region.body_block:
        name = dotted(expr)
        if isinstance(expr, cst.SimpleString):
            return expr
        if name is None or block.call is None:
            return None
        if name in block.env.bound:
            expr = block.env.bound[name][1]
        elif name.startswith("self.") and isinstance(block.call.func, cst.Attribute):
            owner = block.call.func.value
            if not (isinstance(owner, cst.Name) and owner.value == "self"):
                expr = cst.parse_expression(f"{_EMPTY.code_for_node(owner)}.{name[5:]}")
        else:
            return None
        block = block.parent
    return expr


def _find_inputs_outputs(plan: Plan, body: list[cst.BaseStatement], env: Env, enclosing: cst.CSTNode) -> None:
    graph_stmts = [plan.hoisted[i][0] if i in plan.hoisted else body[i] for i in plan.graph]
    written = set().union(*(names_written(s) for s in graph_stmts))
    for index, host in plan.split_ifs.items():  # host statements of keyed ifs leave the step
        stmt = body[index]
        kept = [s for k, s in enumerate(stmt.body.body) if k not in host]
        written -= set().union(*(names_written(s) for s in (stmt.body.body[k] for k in host)))
        written |= set().union(*(names_written(s) for s in kept))
    per_iteration = rebound_in_loop(plan.loop) - set().union(*(names_written(s) for s in graph_stmts)) if graph_stmts else set()
    per_iteration |= set().union(*(names_written(body[i]) for i in range(len(body)) if i not in plan.graph))
    if isinstance(plan.loop.node, cst.For):
        per_iteration |= names_written(cst.Assign([cst.AssignTarget(plan.loop.node.target)], cst.Name("_")))
    outside = _names_read_outside(enclosing, {id(body[i]) for i in plan.graph})
    outside |= set().union(*(names_read(host) for _, host in plan.hoisted.values()))
    defined_outside = _names_written_outside(enclosing, {id(body[i]) for i in plan.graph}) | per_iteration
    read_first: set[str] = set()  # names the step reads before it binds them itself
    bound: set[str] = set()
    for stmt in graph_stmts:
        read_first |= names_read(stmt) - bound
        bound |= names_written(stmt)
    inputs = []
    for name in sorted(read_first):
        if name in per_iteration or (name in written and name in defined_outside):
            if dataflow.is_host_expression(cst.Name(name), env) and not _is_shape_value(name, body):
                if not _only_in_keys(name, plan, body):
                    raise Refusal(PER_STEP_HOST_VALUE, f"the step reads `{name}`, a host value that changes between steps; capture would freeze it")
                continue
            inputs.append(name)
    plan.inputs = _in_source_order(inputs, graph_stmts)
    plan.outputs = _in_source_order([n for n in written if n in outside], graph_stmts)
    after_loop = _names_read_outside(enclosing, {id(plan.loop.node)})
    plan.clones = [n for n in plan.outputs if n in after_loop or _kept_in_loop(n, body, plan)]


def _names_written_outside(root: cst.CSTNode, excluded: set[int]) -> set[str]:
    found: set[str] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in excluded or (isinstance(n, (cst.FunctionDef, cst.ClassDef)) and n is not root):
            continue
        if isinstance(n, (cst.SimpleStatementLine, cst.For, cst.With)):
            found |= names_written(n) if isinstance(n, cst.SimpleStatementLine) else set()
            if isinstance(n, cst.For):
                found |= names_written(cst.Assign([cst.AssignTarget(n.target)], cst.Name("_")))
            if isinstance(n, cst.With):
                found |= {a.name.value for a in (i.asname for i in n.items) if a is not None and isinstance(a.name, cst.Name)}
        stack.extend(children(n))
    return found


def _names_read_outside(root: cst.CSTNode, excluded: set[int]) -> set[str]:
    found: set[str] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in excluded:
            continue
        if isinstance(n, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) and not isinstance(n, (cst.For, cst.While, cst.If, cst.With, cst.Try, cst.FunctionDef, cst.ClassDef)):
            found |= names_read(n)
            continue
        if isinstance(n, (cst.FunctionDef, cst.ClassDef)) and n is not root:
            # another function sees this scope's names only where it does not bind them itself
            found |= names_read(n.body) - names_written(n.body)
            continue
        if isinstance(n, (cst.For, cst.While, cst.If, cst.With)):
            header = n.iter if isinstance(n, cst.For) else n.test if isinstance(n, (cst.While, cst.If)) else None
            if header is not None:
                found |= names_read(header)
            if isinstance(n, cst.With):
                for item in n.items:
                    found |= names_read(item.item)
        stack.extend(children(n))
    return found


def _is_shape_value(name: str, body) -> bool:
    """`n = x.size(0)`: fixed while shapes are fixed, so capture may freeze it."""
    values = [v for s in body for n in walk(s) if isinstance(n, cst.Assign)
              for t in n.targets if isinstance(t.target, cst.Name) and t.target.value == name for v in [n.value]]
    return bool(values) and all(
        any((isinstance(n, cst.Attribute) and n.attr.value == "shape") or (isinstance(n, cst.Call) and _is_shape_read(n) and method_call(n) is not None)
            or (isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == "len") for n in walk(v))
        for v in values
    )


def _only_in_keys(name: str, plan: Plan, body) -> bool:
    for i in plan.graph:
        stmt = body[i]
        if i in plan.keys:
            reads = set().union(*(names_read(s) for s in stmt.body.body)) if isinstance(stmt.body, cst.IndentedBlock) else set()
            if name in reads:
                return False
        elif name in names_read(stmt):
            return False
    return True


def _in_source_order(names, stmts) -> list[str]:
    order: dict[str, int] = {}
    for s in stmts:
        for n in walk(s):
            if isinstance(n, cst.Name) and n.value in names and n.value not in order:
                order[n.value] = len(order)
    return sorted(names, key=lambda n: order.get(n, len(order)))


_HOST_READ_CHAIN = {"item", "tolist", "detach", "cpu", "numpy", "float", "double"}


def _kept_in_loop(name: str, body, plan: Plan) -> bool:
    """An output read after the step only through `.item()`, `float()` or formatting needs no copy;
    anything that keeps the tensor (a list, a best-so-far, the next iteration) does, since the next
    replay overwrites it."""
    return any(not ok for i in range(len(body)) if i not in plan.graph for ok, _ in _uses(body[i], name))


def _uses(stmt: cst.CSTNode, name: str):
    def visit(n, parents):
        if isinstance(n, cst.Name) and n.value == name:
            yield _is_host_read_use(parents), n
            return
        if isinstance(n, (cst.FunctionDef, cst.ClassDef)):
            return
        for c in children(n):
            yield from visit(c, parents + (n,))

    yield from visit(stmt, ())


def _is_host_read_use(parents) -> bool:
    for p in reversed(parents):
        if isinstance(p, cst.Attribute):
            if p.attr.value not in _HOST_READ_CHAIN:
                return False
            if p.attr.value in ("item", "tolist", "numpy"):
                return True
            continue
        if isinstance(p, cst.Call):
            if isinstance(p.func, cst.Name) and p.func.value in ("float", "int", "print", "str"):
                return True
            continue
        if isinstance(p, (cst.FormattedStringExpression, cst.Arg)):
            return isinstance(p, cst.FormattedStringExpression)
        return False
    return False


# ---- partial capture: the model's forward and backward only ------------------------------------------

# Blockers that live outside the model's forward and backward: a loop held back only by these can
# still replay the model from CUDA graphs while the optimizer and scheduler run eagerly.
PARTIAL_OK = {"GFY411"}


@dataclass
class PartialPlan:
    loop: Loop
    model_call: cst.Call  # `model(x)`: it becomes a call of the graphed module
    model: str
    reasons: list[str]  # why the whole step cannot be captured


def make_partial_plan(analysis: LoopAnalysis) -> PartialPlan:
    """A plan to graph only the model's forward and backward, for a training loop whose whole step
    cannot be captured for one of PARTIAL_OK's reasons."""
    loop = analysis.loop
    if loop.kind != "train" or loop.node.orelse is not None:
        raise Refusal(LOOP_SHAPE, "partial capture is for training loops")
    body = body_of(loop)
    env = loop.region.body_block.env
    calls = [n for s in body for n in walk(s) if isinstance(n, cst.Call)]
    model_calls = [c for c in calls if is_model_call(c, env)]
    if len(model_calls) != 1 or not isinstance(model_calls[0].func, cst.Name):
        raise Refusal(LOOP_SHAPE, "partial capture needs exactly one call of the model, by name, in the loop body")
    call = model_calls[0]
    if not call.args or any(a.keyword is not None or a.star for a in call.args):
        raise Refusal(LOOP_SHAPE, "partial capture needs the model called with positional tensors only")
    if not any(isinstance(s, cst.SimpleStatementLine) and any(n is call for n in walk(s)) for s in body):
        raise Refusal(LOOP_SHAPE, "partial capture needs the model call at the top level of the loop body")
    if not any(is_backward(c, env) for c in calls):
        raise Refusal(LOOP_SHAPE, "partial capture needs the backward pass in the loop body")
    zero_grads = [c for c in calls if _is_zero_grad(c)]
    if not zero_grads or any(_keeps_grads(c) for c in zero_grads):
        # a replayed backward hands autograd the graph's gradient buffers: they must not be added to
        raise Refusal(LOOP_SHAPE, "partial capture needs `zero_grad()` (set_to_none) in every step")
    if any(isinstance(n, cst.WithItem) and _is_autocast(n, env) for s in body for n in walk(s)):
        raise Refusal(LOOP_SHAPE, "partial capture under autocast is not supported")
    return PartialPlan(loop, call, call.func.value, list(analysis.reasons))


def _keeps_grads(zero_grad: cst.Call) -> bool:
    value = kwarg(zero_grad, "set_to_none")
    if value is None and zero_grad.args and zero_grad.args[0].keyword is None:
        value = zero_grad.args[0].value
    return value is not None and dotted(value) != "True"
