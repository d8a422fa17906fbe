"""Staged copies: a per-step batch's `.to(device)` or `.cuda()` left outside the captured step is written
`step.stage(x, device)`, which copies on the runtime's copy stream (runtime/staging.py): the same values,
without making the CPU wait for the replays queued before the copy."""

from __future__ import annotations

import libcst as cst

from graphify.analysis.calls import method_call
from graphify.analysis.checker import removable
from graphify.analysis.statements import contains
from graphify.plan import Plan

_TO_KEYWORDS = {"device", "non_blocking"}  # others (dtype, copy, memory_format) change what `.to` returns


def staged_copies(plan: Plan, step_name: str) -> dict[int, str]:
    """The device copies of per-step data made outside the step in the loop's own statements, by id of the
    call, each with the step whose `stage` makes it."""
    return {
        id(f.node): step_name
        for f in plan.copies_outside
        if removable(f) and _device_of(f.node) is not False and any(contains(s, f.node) for s in plan.statements)
    }


def _device_of(call: cst.CSTNode) -> cst.BaseExpression | None | bool:
    """The device a plain copy goes to (None: `.cuda()`'s current device), or False: not a form `stage` takes."""
    m = method_call(call)
    if m is None or m[1] not in ("to", "cuda"):
        return False
    positional = [a for a in call.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if any(a.star for a in call.args) or len(positional) > 1 or not set(keywords) <= _TO_KEYWORDS:
        return False
    device = positional[0].value if positional else keywords.get("device")
    if positional and "device" in keywords:
        return False
    if m[1] == "to" and device is None:
        return False
    return device


def stage_call(updated: cst.Call, step_name: str) -> cst.Call:
    """`x.to(device)` -> `step.stage(x, device)`; `x.cuda()` -> `step.stage(x)`."""
    device = _device_of(updated)
    args = [cst.Arg(updated.func.value)]
    if device is not None:
        args = [args[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), cst.Arg(device)]
    return cst.Call(func=cst.Attribute(cst.Name(step_name), cst.Name("stage")), args=args)
