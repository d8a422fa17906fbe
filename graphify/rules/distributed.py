"""distributed: collectives and DDP machinery in the step."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.calls import iter_nodes, method_call
from graphify.analysis.names import dotted
from graphify.analysis.vocabulary import ACCELERATOR, COLLECTIVE_HELPER, DDP, SYNC_FLAG
from graphify.plan.refusals import DDP_MODEL
from graphify.rules.registry import rule

COLLECTIVE = rule(
    "GFY611", "collective-in-step", "distributed", "error", "`torch.distributed` collectives and barriers need NCCL capture setup", False
)
NO_SYNC = rule("GFY612", "ddp-no-sync", "distributed", "error", "DDP `no_sync()` switches gradient sync per step on the host", False)

RULES = (COLLECTIVE, NO_SYNC, DDP_MODEL)


_COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "barrier",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "all_gather_object",
    "broadcast_object_list",
}

# Accelerator methods that run a collective across processes (an all-gather, all-reduce or barrier).
_ACCELERATE_COLLECTIVES = {"gather", "gather_for_metrics", "reduce", "pad_across_processes", "wait_for_everyone"}


def _is_collective(call: cst.Call, env) -> bool:
    qual = env.qualify(call.func) or ""
    if qual.startswith("torch.distributed.") and qual.rsplit(".", 1)[-1] in _COLLECTIVES:
        return True
    m = method_call(call)
    return m is not None and m[1] in _ACCELERATE_COLLECTIVES and env.kind_of(m[0]) == ACCELERATOR


def _is_collective_helper(call: cst.Call, env, followed: set[int]) -> bool:
    """`utils.reduce_dict(loss_dict)`, `reduce_tensor(loss.data, n)`: a helper of another file, which the
    analysis does not follow, named for a collective and handed a tensor. Bare `reduce`/`gather` (einops,
    functools, `torch.gather`) and tensor methods are not."""
    name = env.qualify(call.func) or dotted(call.func) or ""
    last = name.rsplit(".", 1)[-1]
    if id(call) in followed or name.startswith("torch.") or last in ("reduce", "gather") or not COLLECTIVE_HELPER.search(last):
        return False
    if isinstance(call.func, cst.Attribute) and (env.is_tensor(call.func.value) or env.kind_of(call.func.value) is not None):
        return False
    return bool(call.args) and call.args[0].keyword is None and env.is_tensor(call.args[0].value)


def _toggles_gradient_sync(node: cst.CSTNode) -> bool:
    """DDP's `model.no_sync()` (entered at once or kept for a later `with`), FSDP2's
    `model.set_requires_gradient_sync(flag)`, and `model.require_backward_grad_sync = flag`."""
    if isinstance(node, cst.Assign):
        return any(isinstance(t.target, cst.Attribute) and t.target.attr.value == SYNC_FLAG for t in node.targets)
    if not isinstance(node, cst.Call):
        return False
    m = method_call(node)
    return m is not None and ((m[1] == "no_sync" and not node.args) or (m[1] == "set_requires_gradient_sync" and len(node.args) == 1))


def _toggles_alike_every_step(node: cst.CSTNode, site, ck) -> bool:
    """Whether a DDP sync toggle runs the same way on every step: what decides it (the value assigned,
    the tests of the `if`s and conditional expressions around it) reads only names the loop does not
    change, and the counters of micro-step loops `for k in range(n)` around it, n likewise unchanged. A
    graph then records on which micro-steps DDP all-reduces, and each replay does the same; a test on
    the loop's own counter (`(i + 1) % accum`) is a per-step decision no single graph makes. FSDP2's
    toggle is not: graphify does not capture FSDP."""
    if _is_fsdp_toggle(node):
        return False
    changed = ck.counters | ck.assigned_in_loop
    fixed_counters: set[str] = set()
    controls: list[cst.CSTNode] = [node.value] if isinstance(node, cst.Assign) else []
    for a in site.ancestors:
        if isinstance(a, (cst.If, cst.IfExp, cst.While)):
            controls.append(a.test)
        elif isinstance(a, cst.For) and a is not ck.loop.node:
            bounds = _range_bounds(a.iter)
            if bounds is None or not isinstance(a.target, cst.Name):
                controls.append(a.iter)
            else:
                controls.extend(bounds)
                fixed_counters.add(a.target.value)
    for control in controls:
        for n in iter_nodes(control):  # the control itself first
            if isinstance(n, cst.Call):
                return False
            name = dotted(n) if isinstance(n, (cst.Name, cst.Attribute)) else None
            if name is None or name in fixed_counters:
                continue
            if name in changed or (site.block is not ck.region.body_block and isinstance(n, cst.Name) and n.value != "self"):
                return False  # in a function the step calls, only its micro-step counters are known unchanged
    return True


def _is_fsdp_toggle(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and method_call(node)[1] == "set_requires_gradient_sync"


def _range_bounds(expr: cst.BaseExpression) -> list[cst.BaseExpression] | None:
    if isinstance(expr, cst.Call) and dotted(expr.func) == "range" and all(a.keyword is None and not a.star for a in expr.args):
        return [a.value for a in expr.args]
    return None


def check(ck):
    seen = set()
    followed = {id(b.call) for b in ck.region.blocks} | {id(c) for calls in ck.region.repeats.values() for c, _ in calls}
    for node, site in ck.nodes():
        env = site.env
        if isinstance(node, cst.Call) and (_is_collective(node, env) or _is_collective_helper(node, env, followed)):
            yield ck.finding(
                COLLECTIVE,
                node,
                site,
                f"`{code_of(node)}` in the step",
                "capture needs NCCL >= 2.9.6 with async error handling off; or reduce outside the step",
            )
        elif isinstance(node, cst.Call) and (
            env.kind_of(node.func) == DDP
            or (isinstance(node.func, cst.Attribute) and node.func.attr.value == "forward" and env.kind_of(node.func.value) == DDP)
        ):
            built = ck.construction(node.func, env)
            target = built if built is not None else (node, env.module)
            if id(target[0]) not in seen:
                seen.add(id(target[0]))
                yield ck.finding_at(
                    DDP_MODEL,
                    target[0],
                    target[1],
                    f"`{code_of(target[0])}` runs DDP hooks in the step",
                    "build DDP on a side stream, turn NCCL async error handling off and warm up 11 steps before capture",
                )
        elif _toggles_gradient_sync(node) and not _toggles_alike_every_step(node, site, ck):
            yield ck.finding(
                NO_SYNC,
                node,
                site,
                f"`{code_of(node)}` toggles gradient sync per step",
                "accumulate without switching sync (graphify does not capture FSDP)"
                if _is_fsdp_toggle(node)
                else "sync on the same micro-steps of every step (`for k in range(n)` in the step), or accumulate without no_sync",
            )
