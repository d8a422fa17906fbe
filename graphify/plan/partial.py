"""Partial capture: only the model's forward and backward replay from CUDA graphs."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from graphify.analysis.calls import is_backward, is_delegated_step, is_model_call, is_no_grad_item
from graphify.analysis.names import dotted
from graphify.analysis.region import Loop
from graphify.analysis.statements import walk
from graphify.analysis.vocabulary import DDP
from graphify.model import Rule
from graphify.plan.base import Refusal, body_of
from graphify.plan.dataflow import attribute_targets, is_host_expression
from graphify.rules.distributed import DDP_MODEL
from graphify.rules.rewrite_safety import LOOP_SHAPE

# What the eager code around the graphed models may not do: change attributes or modes the graphed
# forward may read, or pad each batch to its own length. GFY252: the model's inputs change shape every
# batch, so a graph would rarely replay; GFY402: LBFGS re-evaluates its closure, and a graphed model in
# it, under host logic of its own. Collectives around the models run eagerly where they stand; whether a
# model is wrapped in DDP only the run can tell, and GraphedModule leaves such a model eager.
_NEVER = {"GFY703", "GFY252", "GFY402"}


@dataclass
class PartialPlan:
    loop: Loop
    model_calls: list[cst.Call]  # `model(x)` with grad: each becomes a call of its model's graphed module
    models: list[str]  # the models called (`model`, `self.model`), in the order they appear in the loop body
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
    without_grad = {
        id(n)
        for s in body
        for w in walk(s)
        if isinstance(w, cst.With) and any(is_no_grad_item(i.item, env) for i in w.items)
        for n in walk(w)
    }
    model_calls = [c for c in calls if is_model_call(c, env) and id(c) not in without_grad]  # target networks under no_grad stay eager
    names = [_module_called(c) for c in model_calls]
    if not names or None in names:
        raise Refusal(LOOP_SHAPE, "partial capture needs the models called by name, outside no_grad in the loop body")
    for call, name in zip(model_calls, names):
        if "." in name and not _forward_nodes(loop, call):  # `self.model` handed in from elsewhere: its forward unseen
            raise Refusal(LOOP_SHAPE, f"partial capture needs the class of `{name}` known, to check its forward", call)
    rebound = _attributes_assigned(loop) & set(names)
    if rebound:  # the graphed module is made once, before the loop: it would keep graphing the first model
        raise Refusal(LOOP_SHAPE, f"partial capture needs `{min(rebound)}` kept the same model while the loop runs")
    for call in model_calls:
        if env.kind_of(call.func) == DDP:  # its gradients are all-reduced from hooks in the backward a graph would hold
            raise Refusal(DDP_MODEL, "partial capture does not graph a DistributedDataParallel model", call)
        positional = [a for a in call.args if a.keyword is None]
        if not positional or any(a.star for a in call.args) or positional != list(call.args[: len(positional)]):
            raise Refusal(LOOP_SHAPE, "partial capture needs the model called with positional tensors (and keyword values)")
        if any(is_host_expression(a.value, env) for a in positional):
            raise Refusal(LOOP_SHAPE, "partial capture needs the model called with tensors (a host value is a positional argument)")
    if not any(is_backward(c, env) or is_delegated_step(c, env) for c in calls):  # `loss_scaler(loss, optimizer)` runs it
        raise Refusal(LOOP_SHAPE, "partial capture needs the backward pass in the loop body")
    # A call made while the last replay's backward is still to come runs eagerly (GraphedModule), so the
    # model may be called under a condition, or more than once per step.
    forward = {n for call in model_calls for n in _forward_nodes(loop, call)}
    for rule, node in breakers:
        if rule.code in _NEVER:
            raise Refusal(rule, f"partial capture cannot leave {rule.code} ({rule.name}) eager", node)
        if node is not None and id(node) in forward:
            raise Refusal(rule, "the model's forward itself would be captured with it", node)
    return PartialPlan(loop, model_calls, list(dict.fromkeys(names)), list(reasons))


def _module_called(call: cst.Call) -> str | None:
    """`model` or `self.model` for `model(x)` or `self.model(x)`; None for a method (`model.forward(x)`)."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("forward", "generate"):
        return None
    return dotted(call.func)


def _attributes_assigned(loop: Loop) -> set[str]:
    """Attribute chains (`self.model`) assigned anywhere the loop's iterations run, as written there."""
    return {
        dotted(t)
        for n, _ in loop.region.nodes
        if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign))
        for t in attribute_targets(n)
        if dotted(t)
    }


def _forward_nodes(loop: Loop, call: cst.Call) -> set[int]:
    """ids of the nodes the model call runs (its forward, when the model's class is analysed)."""
    region = loop.region
    return {id(n) for n, site in region.nodes if site.block is not region.body_block and any(c is call for c in region.body_calls_of(site))}
