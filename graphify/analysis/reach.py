"""Where a loop's steps run in its body: directly, or inside the functions the body calls."""

from __future__ import annotations

from typing import Callable

import libcst as cst

from graphify.analysis.calls import is_backward, is_model_call, is_step_op, method_call
from graphify.analysis.region import Region
from graphify.analysis.values import Env
from graphify.analysis.vocabulary import MODEL, OPTIMIZER, SCALER


def optimizer_step_chains(region: Region, position: Callable[[cst.CSTNode], int]) -> list[tuple[int, set[int]]]:
    """Each optimizer step of the region (`opt.step()`, `scaler.step(opt)`, a loss-scaler helper, or
    `zero_grad`): where it runs in the loop body, and the ids of it and of every call leading to it."""
    chains = []
    for i, (node, site) in enumerate(region.nodes):
        if not (is_step_op(node, site.env) and not is_backward(node, site.env)) and not _is_zero_grad(node, site.env):
            continue
        calls = region.body_calls_of(site)
        chain = {id(node)} | {id(c) for c in calls}
        block = site.block
        while block.call is not None:
            chain.add(id(block.call))
            block = block.parent
        chains.append((min((position(c) for c in calls), default=i), chain))
    return chains


def first_forward_position(region: Region, position: Callable[[cst.CSTNode], int]) -> int:
    """Where the loop body first runs a model or a backward pass, itself or through a call."""
    return min(
        (
            body_position(region, position, i)
            for i, (n, s) in enumerate(region.nodes)
            if type(n) is cst.Call and (is_model_call(n, s.env) or is_backward(n, s.env))
        ),
        default=len(region.nodes),
    )


def body_position(region: Region, position: Callable[[cst.CSTNode], int], index: int, last: bool = False) -> int:
    """Where the region's node at `index` runs in the loop body: its own position there, or that of the
    body's call leading to it (the first such call, or with `last` the last one). Called functions are
    walked after the body, so their nodes' own positions say nothing of when they run."""
    calls = [position(c) for c in region.body_calls_of(region.nodes[index][1])]
    return (max if last else min)(calls, default=index)


def _is_zero_grad(node: cst.CSTNode, env: Env) -> bool:
    m = method_call(node)
    return m is not None and m[1] == "zero_grad" and env.kind_of(m[0]) in (OPTIMIZER, MODEL, SCALER)
