"""What the non-capturable-optimizer and lr-scheduler rules share."""

import libcst as cst

from graphify.analysis.calls import method_call
from graphify.analysis.checker import kwarg
from graphify.analysis.vocabulary import ADAM_FAMILY, SCHEDULER

# torch's `scheduler.step()`, and timm's per-update `scheduler.step_update(num_updates)`
_SCHEDULER_STEPS = ("step", "step_update")


def optimizer_builds(ck):
    """`(class name, call, module)` of each optimizer the step steps, built where the call stands, once each."""
    seen = set()
    for name, call, module in (found for expr, site in ck.stepped_optimizers for found in ck.optimizer_classes(expr, site.env)):
        if (name, id(call)) not in seen:
            seen.add((name, id(call)))
            yield name, call, module


def adam_without_capturable(name: str, call: cst.Call) -> bool:
    """An optimizer with a `capturable` flag built without it (any expression but a literal False: the user decides)."""
    capturable = kwarg(call, "capturable")
    return name in ADAM_FAMILY and (capturable is None or is_false(capturable))


def scheduler_step(node, env):
    """`(scheduler, method)` of `scheduler.step()` / `scheduler.step_update(n)`, else None."""
    m = method_call(node)
    return m if m is not None and m[1] in _SCHEDULER_STEPS and env.kind_of(m[0]) == SCHEDULER else None


def is_false(expr) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "False"


def outside_called_step(ck, site) -> bool:
    """In the loop body the rewrite runs the LR update between replays; inside a function the step calls
    it would run only once, at capture."""
    return site.block is ck.region.body_block


def lr_fix(tensor_lr: bool) -> str:
    if tensor_lr:
        return "keep the learning rate in a device tensor (`lr=torch.tensor(lr, device=...)`) and update it outside the graph"
    return "this optimizer reads its learning rate on the host: use Adam/AdamW (capturable) or `fused=True`, or keep the LR fixed"
