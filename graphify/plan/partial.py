"""Partial capture: only the model's forward and backward replay from CUDA graphs."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from graphify.analysis.calls import is_backward, is_delegated_step, is_model_call
from graphify.analysis.region import Loop
from graphify.analysis.tree import children
from graphify.analysis.statements import (
    walk,
)
from graphify.model import Rule
from graphify.plan.base import Refusal, body_of
from graphify.plan.dataflow import is_host_expression
from graphify.rules.rewrite_safety import (
    LOOP_SHAPE,
)

# What the eager code around the graphed model may not do: change attributes or modes the graphed
# forward may read, pad each batch to its own length, or communicate across processes (a DDP-wrapped
# model is not graphed alone).
_NEVER = {"GFY703", "GFY252"}  # GFY252: the model's inputs change shape every batch, so a graph would rarely replay
_NEVER_CATEGORIES = {"distributed"}


@dataclass
class PartialPlan:
    loop: Loop
    model_call: cst.Call  # `model(x)`: it becomes a call of the graphed module
    model: str
    reasons: list[str]  # why the whole step cannot be captured


def make_partial_plan(loop: Loop, reasons: list[str], breakers: list[tuple[Rule, cst.CSTNode | None]]) -> PartialPlan:
    """A plan to graph only the model's forward and backward, for a training loop whose whole step
    cannot be captured. `breakers`: every finding and planner refusal of the loop, (rule, node). Those
    outside the model's forward stay eager where they stand; one inside it blocks."""
    if loop.kind != "train" or loop.node.orelse is not None:
        raise Refusal(LOOP_SHAPE, "partial capture is for training loops")
    body = body_of(loop)
    env = loop.region.body_block.env
    calls = [n for s in body for n in walk(s) if isinstance(n, cst.Call)]
    model_calls = [c for c in calls if is_model_call(c, env)]
    if len(model_calls) != 1 or not isinstance(model_calls[0].func, cst.Name):
        raise Refusal(LOOP_SHAPE, "partial capture needs exactly one call of the model, by name, in the loop body")
    call = model_calls[0]
    positional = [a for a in call.args if a.keyword is None]
    if not positional or any(a.star for a in call.args) or positional != list(call.args[: len(positional)]):
        raise Refusal(LOOP_SHAPE, "partial capture needs the model called with positional tensors (and keyword values)")
    if any(is_host_expression(a.value, env) for a in positional):
        raise Refusal(LOOP_SHAPE, "partial capture needs the model called with tensors (a host value is a positional argument)")
    if not _unconditional(body, [call]):
        raise Refusal(LOOP_SHAPE, "partial capture needs the model called once in every step")
    if not any(is_backward(c, env) or is_delegated_step(c, env) for c in calls):  # `loss_scaler(loss, optimizer)` runs it
        raise Refusal(LOOP_SHAPE, "partial capture needs the backward pass in the loop body")
    forward = _forward_nodes(loop, call)
    for rule, node in breakers:
        if rule.code in _NEVER or rule.category in _NEVER_CATEGORIES:
            raise Refusal(rule, f"partial capture cannot leave {rule.code} ({rule.name}) eager", node)
        if node is not None and id(node) in forward:
            raise Refusal(rule, "the model's forward itself would be captured with it", node)
    return PartialPlan(loop, call, call.func.value, list(reasons))


def _forward_nodes(loop: Loop, call: cst.Call) -> set[int]:
    """ids of the nodes the model call runs (its forward, when the model's class is analysed)."""
    region = loop.region
    return {id(n) for n, site in region.nodes if site.block is not region.body_block and any(c is call for c in region.body_calls_of(site))}


def _unconditional(body: list[cst.BaseStatement], calls: list[cst.Call]) -> bool:
    """Whether one of the calls runs in every iteration: a statement of the loop body (or of a `with`
    in it), in a body without `continue`."""
    if any(isinstance(n, cst.Continue) for s in body for n in _walk_same_loop(s)):
        return False
    ids = {id(c) for c in calls}
    stack = list(body)
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, cst.With):
            stack.extend(stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else [])
        elif isinstance(stmt, cst.SimpleStatementLine) and any(id(n) in ids for n in walk(stmt)):
            return True
    return False


def _walk_same_loop(root: cst.CSTNode):
    """The nodes of a statement, nested loops and functions left out (their `continue` is theirs)."""
    stack = [root]
    while stack:
        n = stack.pop()
        yield n
        if n is root or not isinstance(n, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            stack.extend(children(n))
