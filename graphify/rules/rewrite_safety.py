"""rewrite-safety: why `graphify rewrite` leaves a loop alone when capture would change its training.

GFY701-706 are the rewrite planner's refusals, defined with it (graphify/plan/refusals.py) and
registered here: `check` reports every per-step host value, host side effect and mutated state
(GFY701-703) the planner finds, and the reason that decides a loop's verdict; the patterns below report
some of GFY701-703 too. GFY707 is a pattern: the step handed to code the analysis cannot see.
"""

import re

import libcst as cst

from graphify.analysis.calls import is_delegated_step, is_model_call, is_periodic_gpu_branch, is_step_op, iter_nodes, method_call
from graphify.analysis.checker import code_of
from graphify.analysis.names import dotted
from graphify.analysis.randomness import is_host_draw
from graphify.analysis.statements import does_gpu_work, unguarded
from graphify.analysis.vocabulary import ENV, SCALER
from graphify.plan.refusals import (
    HOST_BRANCH_IN_STEP,
    HOST_SIDE_EFFECT,
    LOOP_SHAPE,
    MUTATED_STATE,
    ORDER,
    PER_STEP_HOST_VALUE,
)
from graphify.rules.registry import rule

OPAQUE_STEP = rule(
    "GFY707",
    "step-inside-opaque-helper",
    "rewrite-safety",
    "error",
    "the loss and the optimizer are handed to a callable defined elsewhere, which runs the step out of sight",
    False,
)

RULES = (PER_STEP_HOST_VALUE, HOST_SIDE_EFFECT, MUTATED_STATE, ORDER, HOST_BRANCH_IN_STEP, LOOP_SHAPE, OPAQUE_STEP)


ENV_METHODS = {"step", "reset", "step_async", "step_wait", "render"}  # a (gym) environment simulating on the host
_BUFFER_METHODS = {"add", "sample", "push", "extend", "store"}
_BUFFER_CLASS = re.compile(r"\w*(Replay|Rollout)(Buffer|Memory)$")
_BUFFER_NAME = re.compile(r"^(self\.)?(rb|replay_buffer|replay_memory|rollout_buffer)$")


def _is_replay_buffer(ck, receiver: cst.BaseExpression, env) -> bool:
    if env.is_tensor(receiver):
        return False
    built = ck.construction(receiver, env)
    if built is not None:
        call, module = built
        return bool(_BUFFER_CLASS.match((module.aliases.qualify(call.func) or "").rsplit(".", 1)[-1]))
    return bool(_BUFFER_NAME.match(dotted(receiver) or ""))


def _host_interaction(ck, call: cst.Call, env) -> str | None:
    """What an environment step or a replay-buffer call does on the host, or None."""
    m = method_call(call)
    if m is None:
        return None
    if m[1] in ENV_METHODS and env.kind_of(m[0]) == ENV:
        return "runs the environment on the host"
    if m[1] in _BUFFER_METHODS and _is_replay_buffer(ck, m[0], env):
        return "draws from a host replay buffer" if m[1] == "sample" else "writes a host replay buffer"
    return None


def _decides_gpu_work(node: cst.CSTNode, site) -> bool:
    """In the test of an `if` that launches GPU work in one of its branches, or in a branch without GPU
    work whose alternative has some (an epsilon-greedy action drawn on the host instead of the policy's)."""
    branch = next((a for a in reversed(site.ancestors) if isinstance(a, cst.If)), None)
    if branch is None:
        return False
    if any(n is node for n in iter_nodes(branch.test)):
        return does_gpu_work(branch.body, site.env) or (branch.orelse is not None and does_gpu_work(branch.orelse, site.env))
    if branch.orelse is None:
        return False
    inside, other = (branch.body, branch.orelse) if any(a is branch.body for a in site.ancestors) else (branch.orelse, branch.body)
    return does_gpu_work(other, site.env) and not does_gpu_work(inside, site.env)


def _statement_position(ck, node: cst.CSTNode, site) -> int:
    """Where the node runs in the loop body: the position of its statement line, or of the body's call
    that leads to it when it sits in a called function."""
    call = ck.region.body_call_of(site)
    if call is not None:
        node, site = call, ck.region.nodes[ck.position(call)][1]
    line = next((a for a in reversed(site.ancestors) if isinstance(a, cst.SimpleStatementLine)), node)
    return ck.position(line)


def _after_first_gpu_work(ck, node: cst.CSTNode, site) -> bool:
    """After the statement that starts the step's GPU work (not in it: arguments of the first model call
    are its inputs)."""
    if ck.first_gpu_position >= len(ck.region.nodes):
        return False
    first, first_site = ck.region.nodes[ck.first_gpu_position]
    here, start = _statement_position(ck, node, site), _statement_position(ck, first, first_site)
    if here != start or site.block is ck.region.body_block or any(a is first for a in site.ancestors):
        return here > start
    # in a function the body's statement calls, after the model call there (not in its arguments)
    return ck.execution_order(ck.position(node)) > ck.execution_order(ck.first_gpu_position)


def _draws_step_input(ck, node: cst.CSTNode, site) -> bool:
    """Drawn where the rewrite leaves it eager: every way the loop body reaches it lies in a statement
    before the one that starts the step's work, and after one that already does GPU work (a device copy,
    zero_grad)."""
    if ck.first_gpu_position >= len(ck.region.nodes):
        return False
    first = _statement_position(ck, *ck.region.nodes[ck.first_gpu_position])
    anchors = [node] if site.block is ck.region.body_block else ck.region.body_calls_of(site)
    at = [_statement_position(ck, a, ck.region.nodes[ck.position(a)][1]) for a in anchors]
    if not at or max(at) >= first:
        return False
    body = unguarded(ck.loop.node.body.body) if isinstance(ck.loop.node.body, cst.IndentedBlock) else ()
    before = [s for s in body if ck.position(s) <= min(at)][:-1]
    return any(does_gpu_work(s, ck.body_env) for s in before)


def _host_random_draws(ck):
    """Python or numpy RNG drawn inside the step. After its first GPU work, or deciding whether GPU work
    runs, capture draws once and every replay repeats that outcome. Between the step's first GPU
    statements and its first model call (noise drawn after `zero_grad()`), the draw builds the step's
    inputs: the rewrite draws it before each replay. Draws before any GPU work fetch the batch and are not
    reported."""
    for node, site in ck.nodes():
        if not isinstance(node, cst.Call) or not is_host_draw(node, site.env):
            continue
        if any(isinstance(a, cst.If) and is_periodic_gpu_branch(a, site.env) for a in site.ancestors):
            continue  # evaluation or sampling every N steps runs eagerly between replays (GFY502)
        message = f"`{code_of(node)}` draws a host random number in the step; capture would draw it once"
        if _after_first_gpu_work(ck, node, site) or _decides_gpu_work(node, site):
            yield ck.finding(HOST_SIDE_EFFECT, node, site, message, HOST_SIDE_EFFECT.fix.advice, False)
        elif _draws_step_input(ck, node, site):
            yield ck.finding(
                HOST_SIDE_EFFECT, node, site, message, "graphify rewrite draws it before each replay; or draw it on the device"
            )


def _host_interactions(ck):
    """An environment step or a replay-buffer call after the step has run a model and before its last
    backward/optimizer step (an RL loop acting, storing and sampling between the policy's forward and the
    update; for inference, before its last model call): capture would run it once. Before the model runs
    such calls fetch the step's inputs, after the step they use its outputs: both stay eager."""
    models = steps = None
    for node, site in ck.calls():
        what = _host_interaction(ck, node, site.env)
        if what is None:
            continue
        if models is None:
            models = [_statement_position(ck, n, s) for n, s in ck.calls() if is_model_call(n, s.env)]
            steps = [_statement_position(ck, n, s) for n, s in ck.calls() if is_step_op(n, s.env)] if ck.loop.kind == "train" else models
        here = _statement_position(ck, node, site)
        if any(p < here for p in models) and any(p > here for p in steps):
            message = f"`{code_of(node)}` {what} in the step; capture would run it once"
            yield ck.finding(HOST_SIDE_EFFECT, node, site, message, HOST_SIDE_EFFECT.fix.advice, False)


_HYPERPARAMETERS = {"weight_decay", "momentum", "betas", "eps", "dampening"}  # "lr" is GFY412's


def _param_group_key(target: cst.BaseExpression, site) -> str | None:
    """The key of `opt.param_groups[0]["weight_decay"]`, or of `group["momentum"]` inside
    `for group in opt.param_groups:`."""
    if not isinstance(target, cst.Subscript) or len(target.slice) != 1 or not isinstance(target.slice[0].slice, cst.Index):
        return None
    key = target.slice[0].slice.value
    if not isinstance(key, cst.SimpleString):
        return None
    group = target.value
    if isinstance(group, cst.Subscript):
        group = group.value  # opt.param_groups[0]
    elif isinstance(group, cst.Name):
        loops = [
            a
            for a in site.ancestors
            if isinstance(a, cst.For) and any(n is not group and _same_name(n, group) for n in iter_nodes(a.target))
        ]
        group = loops[-1].iter if loops else None
    in_groups = group is not None and any(isinstance(n, cst.Attribute) and n.attr.value == "param_groups" for n in iter_nodes(group))
    return key.value.strip("'\"") if in_groups else None


def _same_name(node: cst.CSTNode, name: cst.Name) -> bool:
    return isinstance(node, cst.Name) and node.value == name.value


def _hyperparameters_set(ck):
    """`param_group["weight_decay"] = wd_schedule[it]` in the loop: the optimizer step reads the value on the
    host, so the captured step keeps the one it was captured with."""
    for node, site in ck.nodes():
        if not isinstance(node, cst.Assign) or isinstance(node.value, (cst.Integer, cst.Float)):
            continue
        key = next((k for t in node.targets if (k := _param_group_key(t.target, site)) in _HYPERPARAMETERS), None)
        if key is not None:
            yield ck.finding(
                MUTATED_STATE,
                node,
                site,
                f"`{code_of(node)}` changes the optimizer's `{key}` in the loop; the captured step keeps the value it was captured with",
                "keep it constant while the step loop runs (change it between epochs)",
                False,
            )


def _is_number(name: str, ck) -> bool:
    """A counter that holds a number (`step`, `t = T - 1 - i`), not index arrays sliced from it."""
    values = ck.body_env.values_of(name)
    return not any(isinstance(n, (cst.Subscript, cst.Call)) for v in values for n in iter_nodes(v))


def _counter_index(node: cst.Subscript, ck) -> cst.BaseExpression | None:
    """The index of `buf[step]`, `alphas[t]` when it is a per-step host counter of the loop."""
    for el in node.slice:
        if isinstance(el.slice, cst.Index):
            names = [n.value for n in iter_nodes(el.slice.value) if isinstance(n, cst.Name)]
            if names and all(n in ck.counters and _is_number(n, ck) for n in names):
                return el.slice.value
    return None


def _counter_indexed_tensors(ck):
    """A tensor read or written at a slot chosen by the loop's counter: capture fixes the slot. Reads
    that build the step's inputs before its first GPU work stay eager in the rewrite and are not reported."""
    for node, site in ck.nodes():
        if not isinstance(node, cst.Subscript) or site.block is not ck.region.body_block or not site.env.is_tensor(node.value):
            continue
        index = _counter_index(node, ck)
        written = bool(site.ancestors) and isinstance(site.ancestors[-1], cst.AssignTarget)
        if index is not None and (written or _after_first_gpu_work(ck, node, site)):
            yield ck.finding(
                PER_STEP_HOST_VALUE,
                node,
                site,
                f"`{code_of(node)}` is indexed by `{code_of(index)}`, a host value that changes between steps; capture would freeze it",
                PER_STEP_HOST_VALUE.fix.advice,
            )


def check(ck):
    yield from _host_random_draws(ck)
    yield from _host_interactions(ck)
    yield from _hyperparameters_set(ck)
    yield from _counter_indexed_tensors(ck)
    for node, site in ck.nodes():
        if isinstance(node, cst.Call) and is_delegated_step(node, site.env) and site.env.kind_of(node.func) != SCALER:
            yield ck.finding(
                OPAQUE_STEP,
                node,
                site,
                f"`{code_of(node.func)}(...)` is handed the loss and the optimizer; what it runs is not visible",
                "call `loss.backward()` and `optimizer.step()` in the loop, or in a function of the checked files",
            )
