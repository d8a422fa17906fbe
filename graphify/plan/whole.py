"""The whole-step plan: which statements of a loop body become the captured step, what moves around it.

The loop body splits into: statements before the step (kept, eager), the step (from the first model call to
the last backward/optimizer step), and statements after it (kept, eager). Inside the step, host-only statements
(logging, `.item()` reads, LR updates) move out, before or after the call; `GradScaler.step/update` and what
follows stay eager after the call; host conditions such as `(i + 1) % accum == 0` become the key that picks one
graph per branch outcome. dataflow.py says what may enter the step at all.
"""

from __future__ import annotations

import libcst as cst

from graphify.analysis.checker import Finding, removable
from graphify.analysis.calls import is_backward, is_model_call, is_step_op, method_call
from graphify.analysis.devices import device_for_factory
from graphify.analysis.names import dotted
from graphify.analysis.region import Loop
from graphify.analysis.statements import (
    collected_into,
    contains,
    does_gpu_work,
    is_host_read_call,
    is_side_computation,
    names_read,
    names_written,
    walk,
)
from graphify.analysis.tree import children
from graphify.analysis.values import Env
from graphify.analysis.vocabulary import MODEL, OPTIMIZER, is_torch_tensor_call
from graphify.model import FixKind
from graphify.plan import dataflow
from graphify.analysis.step_body import step_statements
from graphify.plan.base import (
    FIXED_IN_PLACE,
    Hoist,
    Plan,
    inside_mode_blocks,
    body_nodes_of,
    body_of,
    if_chain,
    is_pure_binding,
    device_in_loop_scope,
    has_side_effects,
    in_loop_scope,
    is_scaler_call,
    branch_statements,
    fresh_name,
    is_zero_grad,
    moved_statements,
    rebound_in_loop,
    source_of,
    sets_lr,
)
from graphify.plan.draws import drawn_nodes, plan_draws
from graphify.plan.inputs import find_inputs_outputs, is_shape_value
from graphify.plan.mutations import check_loop_mutations
from graphify.plan.refusals import (
    DDP_MODEL,
    HOST_BRANCH_IN_STEP,
    LOOP_SHAPE,
    MUTATED_STATE,
    ORDER,
    PER_STEP_HOST_VALUE,
    Refusal,
)


def make_plan(
    loop: Loop, findings: list[Finding], enclosing: cst.CSTNode, refusals: list[Refusal] | None = None, fetches: list | None = None
) -> Plan:
    """`findings`: every breaker reported in the loop's region; `enclosing`: the function (or module) that
    holds the loop. Raises Refusal when the loop cannot be captured without changing its training: the
    first reason found. `refusals` receives every reason found, for `check` (checks that can go on past a
    reason go on); `fetches`, the `next(...)` calls the plan would fetch before the step, refused or not."""
    found = [] if refusals is None else refusals
    refuse = lambda rule, node, message, certain=True: found.append(Refusal(rule, message, source_of(node), certain))  # noqa: E731
    try:
        plan = _make_plan(loop, findings, enclosing, refuse, [] if fetches is None else fetches)
    except Refusal as refusal:
        refusal.node = source_of(refusal.node)
        found.append(refusal)
    if found:
        raise found[0]
    return plan


def _make_plan(loop: Loop, findings: list[Finding], enclosing: cst.CSTNode, refuse, fetches: list) -> Plan:
    if loop.node.orelse is not None:
        raise Refusal(LOOP_SHAPE, "loops with an `else:` clause are not rewritten", loop.node)
    step_body = step_statements(body_of(loop))
    body = step_body.statements
    env = loop.region.body_block.env
    step_calls, model_calls, zeroing_calls, computing_calls = _calls_into_step(loop)
    env.gpu_calls = step_calls | model_calls | zeroing_calls | computing_calls

    def holds(stmt, test, via):
        return any(isinstance(n, cst.Call) and (test(n, env) or id(n) in via) for n in walk(stmt))

    if loop.kind == "train":
        anchors = [i for i, s in enumerate(body) if holds(s, is_step_op, step_calls)]
    else:
        anchors = [i for i, s in enumerate(body) if holds(s, is_model_call, model_calls)]
    starts = [  # a periodic branch before the step (evaluation every N steps) runs eagerly between replays
        i
        for i, s in enumerate(body)
        if holds(s, is_model_call, model_calls | step_calls)
        and (i in anchors or loop.kind != "train" or not _is_periodic_branch(body, i, anchors, env, step_calls))
    ]
    if not anchors or not starts:  # the model reached through a dict of functions, `super()`: not followed
        seen = "the optimizer step" if loop.kind == "train" and not anchors else "a model call"
        raise Refusal(LOOP_SHAPE, f"{seen} is not seen in the loop body (a call it goes through is not followed)")
    plan = Plan(loop, loop.kind, first=min(starts[0], anchors[0]), last=anchors[-1])
    plan.statements, plan.origins = body, step_body.origins
    _refuse_closures(plan, body, refuse)
    _split_step(plan, body, env, refuse)
    _pull_in_zero_grad(plan, body, env)
    if plan.keys and any(id(n) in zeroing_calls for i in plan.graph for n in walk(body[i])):
        # each keyed graph keeps its own gradient buffers only if zero_grad keeps them (set_to_none=False)
        refuse(LOOP_SHAPE, None, "gradients are zeroed inside a function the step calls, between keyed branches")
    plan_draws(plan, body, findings, env)
    fetches.extend(plan.fetches)
    dataflow.check_captured_code(plan, body, refuse)
    _check_breakers(plan, findings, body, refuse)
    plan.device_factories = {
        id(f.node): device_for_factory(f.node, f.module.aliases) for f in findings if f.rule.fix.kind is FixKind.ON_DEVICE and removable(f)
    }
    plan.ddp_builds = {
        id(f.node)
        for f in findings
        if f.rule is DDP_MODEL
        and f.module is loop.module
        and isinstance(f.node, cst.Call)
        and (f.module.aliases.qualify(f.node.func) or "").endswith("parallel.DistributedDataParallel")
    }
    find_inputs_outputs(plan, body, env, enclosing, refuse)
    check_loop_mutations(plan, body, refuse)
    for i in sorted(plan.after):
        dataflow.check_moved_statement(plan, body, i, refuse)
    dataflow.check_hoisted_exits(plan, body, refuse)
    return plan


def _refuse_closures(plan: Plan, body: list[cst.BaseStatement], refuse) -> None:
    """A function or lambda defined in the loop reads the loop's names when it is called, not through
    the step's inputs: a replay would run it on the tensors of the capture."""
    for i, stmt in enumerate(body):
        for n in walk(stmt):
            if isinstance(n, (cst.FunctionDef, cst.ClassDef)) or (isinstance(n, cst.Lambda) and plan.first <= i <= plan.last):
                refuse(LOOP_SHAPE, n, "a function defined inside the loop reads its names at call time")


def _calls_into_step(loop: Loop) -> tuple[set[int], set[int], set[int], set[int]]:
    """Calls in the loop body that run a backward/optimizer step, a model, zero gradients
    (`reset_grad()`), or other device math, inside a called function."""
    steps, models, zeroing, computing = set(), set(), set(), set()
    region = loop.region
    for node, site in region.nodes:
        if site.block is region.body_block or not isinstance(node, cst.Call):
            continue
        calls = {id(call) for call in region.body_calls_of(site)}
        if is_step_op(node, site.env):
            steps |= calls
        elif is_model_call(node, site.env):
            models |= calls
        elif is_zero_grad(node) and site.env.kind_of(node.func.value) in (OPTIMIZER, MODEL):
            zeroing |= calls
        elif _tensor_op(node, site.env):
            # `acc1, acc5 = accuracy(output, target)`: device math on the step's tensors in a function of the file
            # (not a batch fetch such as `get_batch()`, whose host tensors are the step's inputs)
            body_env = region.body_block.env
            computing |= {id(c) for c in region.body_calls_of(site) if any(body_env.is_tensor(a.value) for a in c.args)}
    return steps, models, zeroing, computing


def _tensor_op(node: cst.Call, env: Env) -> bool:
    """A torch operation or a tensor method that computes on the device (host reads excluded)."""
    if is_host_read_call(node, env):
        return False
    m = method_call(node)
    return is_torch_tensor_call(env.qualify(node.func)) or (m is not None and env.is_tensor(m[0]))


def _split_step(plan: Plan, body: list[cst.BaseStatement], env: Env, refuse) -> None:
    span, scaler_branch = _split_at_scaler(plan, body, env)
    graph_writes: set[str] = set()
    rebound = rebound_in_loop(plan.loop)
    for pos, i in enumerate(span):
        stmt = body[i]
        _split_off_host_work(plan, i, stmt, env)
        if i in plan.hoisted:
            plan.graph.append(i)
            graph_writes |= set(plan.hoisted[i].names)
            continue
        later_reads = set().union(*(names_read(body[j]) for j in span[pos + 1 :]))
        # a statement moved after the call must not read a name the rest of the step binds again
        rebound_later = names_read(stmt) & set().union(*(names_written(body[j]) for j in span[pos + 1 :]))
        writes = names_written(stmt)
        if does_gpu_work(stmt, env):
            if is_side_computation(stmt, env) and not (writes | collected_into(stmt)) & later_reads and not rebound_later:
                # `total_loss += loss.detach()`: nothing in the step needs it, so it runs after the call
                plan.after.append(i)
                continue
            plan.graph.append(i)
            graph_writes |= writes
            if isinstance(stmt, cst.If):
                _plan_keyed_if(plan, i, stmt, env, later_reads, refuse, scaler_branch.get(i))
                host = moved_statements(stmt, plan.split_ifs[i]) if i in plan.split_ifs else []
                _refuse_rebound(host, set().union(*(names_written(body[j]) for j in span[pos + 1 :])), refuse)
            continue
        if writes & later_reads:
            varying = {n for n in (names_read(stmt) & rebound) - graph_writes if not is_shape_value(n, body)}
            if has_side_effects(source_of(stmt)) or varying:
                why = f"reads `{sorted(varying)[0]}`, which changes between steps" if varying else "calls code with possible side effects"
                refuse(PER_STEP_HOST_VALUE, stmt, f"a host statement the step needs {why}; capture would run it once", certain=False)
            plan.graph.append(i)  # a host value the step needs (a shape, a constant): computed once at capture
            graph_writes |= writes
        elif rebound_later and not has_side_effects(source_of(stmt)):
            plan.graph.append(i)  # `real_score = outputs` before `outputs` is bound again: kept in its place
            graph_writes |= writes
        elif rebound_later:
            _refuse_rebound([stmt], rebound_later, refuse)
        elif names_read(stmt) & graph_writes or not sets_lr(stmt, env):
            plan.after.append(i)
        else:
            plan.before.append(i)
    if not any(
        isinstance(n, cst.Call) and (is_step_op(n, env) or is_model_call(n, env) or id(n) in env.gpu_calls)
        for i in plan.graph
        for n in walk(body[i])
    ):
        raise Refusal(LOOP_SHAPE, "nothing left to capture")
    for i in plan.graph:
        for n in walk(body[i]):
            if plan.keys and is_zero_grad(n):
                plan.zero_grads.append(n)
    region = plan.loop.region
    graph_nodes = [body[i] for i in plan.graph]
    for node, site in region.nodes:
        m = method_call(node)
        if m is None or m[1] != "step" or not is_step_op(node, site.env) or site.env.kind_of(m[0]) != OPTIMIZER:
            continue
        if not any(contains(s, anchor) for s in graph_nodes for anchor in body_nodes_of(plan, node)):
            continue
        optimizer = in_loop_scope(plan, m[0], site.block)  # the runtime finds the optimizers itself
        if optimizer is not None and optimizer not in plan.optimizers:
            plan.optimizers.append(optimizer)


def _refuse_rebound(stmts: list[cst.BaseStatement], rebound: set[str], refuse) -> None:
    for stmt in stmts:
        names = sorted(names_read(stmt) & rebound)
        if names:
            why = f"reads `{names[0]}` before the step binds it again: after the call it would read the new value"
            refuse(ORDER, stmt, f"a host statement inside the step {why}")


def _pull_in_zero_grad(plan: Plan, body: list[cst.BaseStatement], env: Env) -> None:
    """`optimizer.zero_grad()` calls shortly before the step move into the step. Captured, it only hands
    the gradients to the graph's pool, which every replay refills in place; left outside, it would
    cost a Python call per step and leave `.grad` unset after each replay. Statements between it and
    the step (batch preparation) must not touch gradients, nor leave the iteration (`if done: break`)."""
    if any(any(isinstance(n, cst.Call) and (is_step_op(n, env) or is_zero_grad(n)) for n in walk(body[k])) for k in plan.keys):
        return  # gradient accumulation: the keyed branches step and zero the gradients
    for i in range(plan.first - 1, -1, -1):
        stmt = body[i]
        if dataflow.exit_of(stmt):
            return
        calls = [n for n in walk(stmt) if isinstance(n, cst.Call)]
        zero = [c for c in calls if is_zero_grad(c)]
        if (
            zero
            and isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and stmt.body[0].value is zero[0]
        ):
            plan.graph.insert(0, i)
            plan.pulled_in.append(i)
            continue  # `model.zero_grad(); head.zero_grad()`: each one left outside would unset `.grad`
        if (
            zero
            or any(is_step_op(c, env) or id(c) in env.gpu_calls for c in calls)
            or any(isinstance(n, cst.Attribute) and n.attr.value == "grad" for n in walk(stmt))
        ):
            return


def _split_at_scaler(plan: Plan, body: list[cst.BaseStatement], env: Env) -> tuple[list[int], dict[int, int]]:
    """The statements of the step that may be captured: GradScaler.step/update (unscaling, clipping) and
    what follows run eagerly after the call (plan.tail). A keyed `if` holding the scaled backward and
    the scaler's step: its index -> where in its branch the eager part starts."""
    span = list(range(plan.first, plan.last + 1))
    for i in span:
        if not _calls_scaler(body[i], env):
            continue
        if _runs_backward([body[j] for j in span if j < i], env):
            plan.tail = [j for j in span if j >= i]
            return [j for j in span if j < i], {}
        if (k := _scaler_after_backward_in_branch(body[i], env)) is not None:
            plan.tail = [j for j in span if j > i]  # `if use_amp: <scaled backward>; scaler.step(...) else: ...`
            return [j for j in span if j <= i], {i: k}
        _refuse_scaler_before_backward(body[i], env)
    return span, {}


def _scaler_after_backward_in_branch(stmt: cst.BaseStatement, env: Env) -> int | None:
    """In `if use_amp: scaler.scale(loss).backward(); scaler.step(opt); scaler.update() else: loss.backward();
    opt.step()`, where the `if`'s own branch hands over to the scaler (the index of that statement): from there
    on the branch runs eagerly after the replay, under the same test, as a GradScaler step does after an
    unbranched backward. None when the scaler comes before the branch's backward, or stands in an `elif`/`else`."""
    if not isinstance(stmt, cst.If):
        return None
    chain = if_chain(stmt)
    if chain.one_line or any(_calls_scaler(s, env) for branch in chain.branches[1:] for s in branch):
        return None
    branch = step_statements(chain.branches[0], guards=False).statements
    first = next((k for k, s in enumerate(branch) if _calls_scaler(s, env)), None)
    return first if first is not None and _runs_backward(branch[:first], env) else None


def _calls_scaler(stmt: cst.BaseStatement, env: Env) -> bool:
    return any(is_scaler_call(n, env) for n in walk(stmt))


def _runs_backward(stmts: list[cst.BaseStatement], env: Env) -> bool:
    return any(isinstance(n, cst.Call) and is_backward(n, env) for s in stmts for n in walk(s))


def _refuse_scaler_before_backward(stmt: cst.BaseStatement, env: Env) -> None:
    if _runs_backward([stmt], env):
        why = "the GradScaler step shares a statement (a branch) with the backward pass: the step is split at the scaler, which runs eagerly after the captured backward"
        raise Refusal(LOOP_SHAPE, why, stmt)
    raise Refusal(LOOP_SHAPE, "GradScaler step comes before the backward pass", stmt)


def _split_off_host_work(plan: Plan, index: int, stmt: cst.BaseStatement, env: Env) -> None:
    """A statement that mixes the step's GPU work with host work is split in two (plan.hoisted): the GPU
    half is captured, the host half runs after the replay (inside the mode block it stood in, if any)."""
    stmt = inside_mode_blocks(stmt)
    _hoist_host_reads(plan, index, stmt, env)
    if index not in plan.hoisted:
        _hoist_collected(plan, index, stmt, env)


_COLLECTING_METHODS = {"append", "extend"}


def _hoist_collected(plan: Plan, index: int, stmt: cst.BaseStatement, env: Env) -> None:
    """Split `outputs.append(model(x))` into a captured assignment and the append after the replay (of a
    copy: the next replay overwrites the graph's output)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Expr):
        return
    call = stmt.body[0].value
    m = method_call(call)
    if m is None or m[1] not in _COLLECTING_METHODS or len(call.args) != 1 or call.args[0].keyword or call.args[0].star:
        return
    receiver, value = dotted(m[0]), call.args[0].value
    if receiver is None or does_gpu_work(m[0], env) or not does_gpu_work(value, env) or is_side_computation(stmt, env):
        return  # `losses.append(loss.detach())` runs after the step as it stands
    plan.hoisted[index] = Hoist([value], [fresh_name(f"{receiver.rsplit('.', 1)[-1]}_item", plan.loop.module.names)])
    plan.hoisted_reads.add(id(call))


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
    plan.hoisted[index] = Hoist([r for _, r in reads], [fresh_name(base, plan.loop.module.names) for _ in reads])
    plan.hoisted_reads.update(id(call) for call, _ in reads)


def _is_periodic_branch(body: list[cst.BaseStatement], index: int, anchors: list[int], env: Env, step_calls: set[int]) -> bool:
    """`if step % k == 0:` holding evaluation (model calls, no backward or optimizer step), whose results
    the step's GPU work does not read: a branch binding the loss the step backpropagates (`if use_amp:
    loss = ... else: loss = ...`) is part of the step."""
    stmt = body[index]
    if not isinstance(stmt, cst.If) or env._tensor(stmt.test, 0) is True:
        return False
    if any(isinstance(n, cst.Call) and (is_step_op(n, env) or is_backward(n, env) or id(n) in step_calls) for n in walk(stmt)):
        return False
    later = range(index + 1, max(anchors, default=index) + 1)
    step_reads = set().union(*(names_read(body[j]) for j in later if does_gpu_work(body[j], env)))
    return not names_written(stmt) & step_reads


def _plan_keyed_if(plan: Plan, index: int, stmt: cst.If, env: Env, read_after: set[str], refuse, eager_from: int | None = None) -> None:
    """A host branch whose branches do GPU work: the key holds every test's outcome (`if a: ... elif b: ...
    else: ...` keys on `a` and `b`), so each way through gets its graph. In every branch, host statements
    the step does not read run after the replay under the same tests (plan.split_ifs), and so does all of
    the `if`'s own branch from `eager_from` on (a GradScaler's step); a host statement the step reads may
    stay in the graph only if it runs the same at capture as at every replay (a binding of items)."""
    if env._tensor(stmt.test, 0) is True:
        return
    chain = if_chain(stmt)
    if chain.one_line:
        return refuse(HOST_BRANCH_IN_STEP, stmt, "a one-line host branch inside the step")
    if any(env._tensor(test, 0) is True for test in chain.tests[1:]):
        return refuse(HOST_BRANCH_IN_STEP, stmt, "an `elif` on a tensor value inside the step")
    plan.keys.append(index)
    moved = []
    for b, branch in enumerate(branch_statements(stmt)):
        statements, host = branch.statements, set()
        for k, s in enumerate(statements):
            if b == 0 and eager_from is not None and k >= eager_from:
                host.add(k)
                continue
            if does_gpu_work(s, env):
                continue
            needed = names_written(s) & (read_after | set().union(*(names_read(t) for t in statements[k + 1 :])))
            if needed and not is_pure_binding(source_of(s)):
                return refuse(
                    HOST_BRANCH_IN_STEP, s, f"a host statement of a branch inside the step binds `{min(needed)}`, which the step reads"
                )
            if not needed:
                host.add(k)
        moved.append(host)
    if any(moved):
        plan.split_ifs[index] = moved


def _check_breakers(plan: Plan, findings: list[Finding], body: list[cst.BaseStatement], refuse) -> None:
    captured = [body[i] for i in plan.graph]
    drawn = drawn_nodes(plan)
    for f in findings:
        if (f.rule.fix.kind is FIXED_IN_PLACE and removable(f)) or id(f.node) in plan.hoisted_reads or id(f.node) in drawn:
            continue
        if f.rule.fix.kind is FixKind.ON_DEVICE and removable(f):  # its factory gets `device=` (plan.device_factories)
            continue
        anchors = body_nodes_of(plan, f.node)  # a function the body calls twice: each call
        if not removable(f):
            # a breaker in a statement that stays outside the step runs eagerly, where it stands; the
            # fixed-in-place rules and dynamic shapes describe the captured step wherever they are reported
            if (
                f.rule.fix.kind is not FIXED_IN_PLACE
                and f.rule.category != "dynamic-shape"
                and f.rule is not MUTATED_STATE  # state the step reads, wherever the loop changes it
                and all(any(contains(s, anchor) for s in body) for anchor in anchors)
                and not any(contains(s, anchor) for s in captured for anchor in anchors)
            ):
                plan.eager.append(f)
                continue
            refuse(f.rule, f.node, f.message)
            continue
        in_graph = [(s, anchor) for anchor in anchors for s in captured if contains(s, anchor)]
        if not in_graph:
            if f.rule.fix.kind is FixKind.STATIC_INPUT:
                plan.copies_outside.append(f)
            continue
        stmt, anchor = in_graph[0]
        if f.rule.fix.kind is FixKind.STATIC_INPUT:
            # An input copied inside the step: CapturedStep moves host inputs to `device` first,
            # which turns the copy into a no-op.
            device = device_in_loop_scope(plan, f.node)
            if device is None:
                refuse(f.rule, f.node, "cannot tell which device inputs go to")
                continue
            plan.device = plan.device or device
            continue
        if anchor is not f.node:
            refuse(f.rule, f.node, f"{f.message} (inside a function the step calls)")
            continue
        index = body.index(stmt)
        moved = moved_statements(stmt, plan.split_ifs[index]) if index in plan.split_ifs else []
        if not any(contains(s, f.node) for s in moved):
            refuse(f.rule, f.node, f"{f.message} (would stay inside the captured step)")
