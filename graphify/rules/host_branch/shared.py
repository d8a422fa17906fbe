"""What the host-branch rules share: which host `if`s change the GPU work of a step."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.calls import is_optimizer_step, is_periodic_gpu_branch, iter_nodes, method_call
from graphify.analysis.statements import does_gpu_work, exit_else, is_host_read_call
from graphify.analysis.vocabulary import ACCELERATOR, MODEL, OPTIMIZER, SCALER


def _steps_optimizer(body, env) -> bool:
    for n in iter_nodes(body):
        if isinstance(n, cst.Call) and is_optimizer_step(n, env):
            return True
        m = method_call(n)
        if m is not None and m[1] == "zero_grad" and env.kind_of(m[0]) in (OPTIMIZER, MODEL, SCALER):
            return True
    return False


def _is_counter_modulo(test) -> bool:
    return any(isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo) for n in iter_nodes(test))


def _reads_counter(test, ck) -> bool:
    counters = ck.counters
    return any(isinstance(n, cst.Name) and n.value in counters for n in iter_nodes(test))


def _reads_loop_value(test, ck, env, depth: int = 0) -> bool:
    """A test on a name the loop rebinds (`need_update`), in a called function through the argument of a parameter."""
    changed = ck.counters | ck.assigned_in_loop
    for n in iter_nodes(test):
        if not isinstance(n, cst.Name):
            continue
        if n.value in env.bound and env is not ck.body_env:
            caller, arg = env.bound[n.value]
            if depth < 4 and _reads_loop_value(arg, ck, caller, depth + 1):
                return True
        elif n.value in changed:
            return True
    return False


def _on_sync_boundary(test, env) -> bool:
    """`accelerator.sync_gradients`: accelerate's step counter says whether this micro-step ends an
    accumulation cycle, so it is true on one step in k."""
    return any(
        isinstance(n, cst.Attribute) and n.attr.value == "sync_gradients" and env.kind_of(n.value) == ACCELERATOR for n in iter_nodes(test)
    )


def _does_work(body, env) -> bool:
    """Anything beyond logging and host reads: GPU work, or calls whose effect graphify cannot see."""
    return any(isinstance(n, cst.Call) and not is_host_read_call(n, env) for n in iter_nodes(body))


def accumulates(item: cst.WithItem, env) -> bool:
    m = method_call(item.item)
    return m is not None and m[1] == "accumulate" and env.kind_of(m[0]) == ACCELERATOR


def _skips_step(node: cst.If, site, ck) -> bool:
    """`if not need_update: continue` between the backward pass and `optimizer.step()`: accumulation
    written as a skip of the rest of the iteration, on a value that changes every step. (A skip before
    any forward pass, as when resuming, leaves out whole iterations and splits no step.)"""
    if (
        site.block is not ck.region.body_block
        or ck.position(node) < ck.first_forward_in_body
        or any(isinstance(a, (cst.For, cst.While)) and a is not ck.loop.node for a in site.ancestors)
    ):
        return False
    leaves = any(isinstance(n, cst.Continue) for n in _outside_loops(node.body))
    return leaves and _reads_counter(node.test, ck) and ck.steps_optimizer_after(node)


def _returns_before_step(node: cst.If, site, ck) -> bool:
    """`if len(accum_batches) < k: return None` in a function the step calls, after GPU work and before the
    function steps the optimizer: accumulation written as an early return, on state the loop carries."""
    block = site.block
    at = next((i for i, stmt in enumerate(block.stmts) if stmt is node), None)
    if block is ck.region.body_block or site.ancestors or at is None:
        return False
    return (
        any(isinstance(n, cst.Return) for n in _outside_loops(node.body))
        and any(does_gpu_work(stmt, site.env) for stmt in block.stmts[:at])
        and any(ck.steps_optimizer(stmt) for stmt in block.stmts[at + 1 :])
        and _reads_carried_state(node.test, ck, site.env)
    )


def _reads_carried_state(expr, ck, env, depth: int = 0) -> bool:
    """Whether a called function's expression reads, through its parameters and the locals built from them,
    a name the loop rebinds (`accum_state` handed back by each call)."""
    if depth > 4:
        return False
    for n in iter_nodes(expr):
        if not isinstance(n, cst.Name):
            continue
        if env is ck.body_env:
            if n.value in ck.counters | ck.assigned_in_loop:
                return True
        elif n.value in env.bound:
            caller, arg = env.bound[n.value]
            if _reads_carried_state(arg, ck, caller, depth + 1):
                return True
        elif any(_reads_carried_state(v, ck, env, depth + 1) for v in env.scope.values.get(n.value, ())):
            return True
    return False


def _outside_loops(root):
    stack = [root]
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            stack.extend(n.children)


def _else_does_gpu_work(node: cst.If, env) -> bool:
    """`if step < warmup: random action else: policy(obs)`: the else branch holds the GPU work."""
    orelse = node.orelse
    return isinstance(orelse, cst.Else) and does_gpu_work(orelse.body, env)


def host_if(node, site) -> bool:
    """An `if` whose test is not a tensor's value (that is a data-dependent branch)."""
    return isinstance(node, cst.If) and site.env._tensor(node.test, 0) is not True


def accumulation(node: cst.If, site, ck) -> tuple[str, str, bool] | None:
    """A host `if` that decides whether the step steps the optimizer (gradient accumulation): the
    finding's message, fix and whether the rewrite removes it; None for any other."""
    if _steps_optimizer(node.body, site.env) and not ck.is_loop_invariant(node.test, site.env):
        return (
            f"optimizer step under host condition `{code_of(node.test)}`",
            "capture one graph per accumulation cycle (graphify rewrite does this for `step % k` conditions)",
            _is_counter_modulo(node.test),
        )
    if _reads_loop_value(node.test, ck, site.env) and (
        ck.steps_optimizer(node.body) or (node.orelse is not None and ck.steps_optimizer(node.orelse))
    ):
        return (
            f"host condition `{code_of(node.test)}` decides how a function it calls steps the optimizer",
            "capture one graph per outcome of the condition, or make it constant for the loop",
            False,
        )
    jump = "continue" if _skips_step(node, site, ck) else "return" if _returns_before_step(node, site, ck) else None
    if jump is not None:
        return (
            f"`{jump}` under host condition `{code_of(node.test)}` skips the optimizer step (gradient accumulation)",
            "capture one graph per accumulation cycle, or accumulate with `step % k` around the optimizer step",
            False,
        )
    return None


def periodic_work(node: cst.If, site, ck) -> bool:
    """GPU work under a step-counter condition (evaluation every N steps, a warmup branch)."""
    return exit_else(node) is None and (
        (is_periodic_gpu_branch(node, site.env) and not ck.is_loop_invariant(node.test, site.env))
        or (_reads_counter(node.test, ck) and (does_gpu_work(node.body, site.env) or _else_does_gpu_work(node, site.env)))
        or (_on_sync_boundary(node.test, site.env) and _does_work(node.body, site.env))
    )
