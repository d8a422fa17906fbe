"""What the distributed rules share: which calls run collectives or DDP's forward."""

import libcst as cst

from graphify.analysis.calls import method_call
from graphify.analysis.names import dotted
from graphify.analysis.vocabulary import ACCELERATOR, COLLECTIVE_HELPER, COLLECTIVE_NAME, DDP

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


def followed_calls(ck) -> set[int]:
    """The calls of the loop whose functions the analysis follows."""
    return {id(b.call) for b in ck.region.blocks} | {id(c) for calls in ck.region.repeats.values() for c, _ in calls}


def _is_collective(call: cst.Call, env) -> bool:
    qual = env.qualify(call.func) or ""
    if qual.startswith("torch.distributed.") and qual.rsplit(".", 1)[-1] in _COLLECTIVES:
        return True
    m = method_call(call)
    return m is not None and m[1] in _ACCELERATE_COLLECTIVES and env.kind_of(m[0]) == ACCELERATOR


def _is_collective_helper(call: cst.Call, env, followed: set[int]) -> bool:
    """`utils.reduce_dict(loss_dict)`, `reduce_tensor(loss.data, n)`: a helper of another file, which the
    analysis does not follow, named for a collective and handed a tensor; or named for nothing else than
    one (an MPI call, an all-reduce, a barrier) and handed anything but host values alone. Bare `reduce`/`gather` (einops,
    functools, `torch.gather`) and tensor methods are not."""
    name = env.qualify(call.func) or dotted(call.func) or ""
    last = name.rsplit(".", 1)[-1]
    if id(call) in followed or name.startswith("torch."):
        return False
    if isinstance(call.func, cst.Attribute) and (env.is_tensor(call.func.value) or env.kind_of(call.func.value) is not None):
        return False
    if COLLECTIVE_NAME.search(last):
        # `mpi_avg_grads(ac.pi)`, `fabric.barrier()`, `allreduce_grads(model)`; not one handed only host values
        # (`dist.all_gather(comm)` of a dict of floats read after the step: bookkeeping between replays)
        return not call.args or not all(env.is_host(a.value) for a in call.args)
    if last in ("reduce", "gather") or not COLLECTIVE_HELPER.search(last):
        return False
    return bool(call.args) and call.args[0].keyword is None and env.is_tensor(call.args[0].value)


def runs_collective(node: cst.CSTNode, env, followed: set[int]) -> bool:
    """A `torch.distributed` collective, an Accelerator's, or a helper named for one."""
    return isinstance(node, cst.Call) and (_is_collective(node, env) or _is_collective_helper(node, env, followed))


def runs_ddp(node: cst.CSTNode, env, followed: set[int]) -> bool:
    """A call of a DDP model or of its `forward` (a collective call is not)."""
    return (
        isinstance(node, cst.Call)
        and (
            env.kind_of(node.func) == DDP
            or (isinstance(node.func, cst.Attribute) and node.func.attr.value == "forward" and env.kind_of(node.func.value) == DDP)
        )
        and not runs_collective(node, env, followed)
    )
