"""GFY412 lr-assignment."""

import re

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.vocabulary import OPTIMIZER, SCHEDULER
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.optimizers.shared import lr_fix, outside_called_step, scheduler_step
from graphify.rules.registry import rule

RULE = rule(
    "GFY412",
    "lr-assignment",
    "lr-scheduler",
    "error",
    "assigning `param_group['lr']` changes a float learning rate that capture froze",
    True,
    Fix(FixKind.IN_PLACE, Applicability.SAFE),
)


# helpers named for setting an optimizer's learning rate: `adjust_learning_rate(optimizer, it)`, `opt.step_and_update_lr()`
_LR_SETTER = re.compile(r"(?:^|_)(?:adjust|update|set)_(?:learning_rate|lr)$")


def _unseen_lr_update(call: cst.Call, site, env) -> str | None:
    """A call that sets the learning rate in code graphify does not see (another file, a library): a callable
    scheduler called for its effect (`scheduler(step)`, as open_clip's), or a helper named for it handed an
    optimizer (`adjust_learning_rate(optimizer, it)`, `optimizer.step_and_update_lr()`)."""
    func = call.func
    if isinstance(func, (cst.Name, cst.Attribute)) and env.kind_of(func) == SCHEDULER and isinstance(site.ancestors[-1], cst.Expr):
        return "calls a learning-rate scheduler, which sets the optimizer's float learning rate,"
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    if not _LR_SETTER.search(name):
        return None
    handed = [a.value for a in call.args] + ([func.value] if isinstance(func, cst.Attribute) else [])
    return "sets the optimizer's float learning rate" if any(env.kind_of(e) == OPTIMIZER for e in handed) else None


def _followed(ck, call: cst.Call) -> bool:
    """Whether the step's walk entered the function this call runs (its LR assignments are then seen there)."""
    region = ck.region
    return any(b.call is call for b in region.blocks) or any(c is call for calls in region.repeats.values() for c, _ in calls)


def _followed(ck, call: cst.Call) -> bool:
    """Whether the step's walk entered the function this call runs (its LR assignments are then seen there)."""
    region = ck.region
    return any(b.call is call for b in region.blocks) or any(c is call for calls in region.repeats.values() for c, _ in calls)


def _is_lr_subscript(target) -> bool:
    if not isinstance(target, cst.Subscript):
        return False
    return any(
        isinstance(el.slice, cst.Index) and isinstance(el.slice.value, cst.SimpleString) and el.slice.value.value.strip("'\"") == "lr"
        for el in target.slice
    )


def detect(ck):
    tensor_lr = None
    for node, site in ck.nodes():
        env = site.env
        if scheduler_step(node, env) is not None:
            continue  # GFY411
        if isinstance(node, cst.Call) and not _followed(ck, node) and (what := _unseen_lr_update(node, site, env)):
            yield ck.finding(RULE, node, site, f"`{code_of(node)}` {what} every step", lr_fix(False), False, order=(1, ck.position(node)))
        elif isinstance(node, cst.Assign) and any(_is_lr_subscript(t.target) for t in node.targets):
            tensor_lr = ck.optimizers_take_tensor_lr() if tensor_lr is None else tensor_lr
            yield ck.finding(
                RULE,
                node,
                site,
                f"`{code_of(node)}` sets a float learning rate inside the step",
                lr_fix(tensor_lr),
                tensor_lr and outside_called_step(ck, site),
                order=(1, ck.position(node)),
            )


CASES = {
    "callable-scheduler-and-lr-helper": (
        """
        import lr_sched
        scheduler = lr_sched.cosine_lr(opt, 0.1, 100, 1000)
        for i, (x, y) in enumerate(loader):
            scheduler(i)  # here
            lr_sched.adjust_learning_rate(opt, i)  # here
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        import lr_sched
        scheduler = lr_sched.cosine_lr(opt, 0.1, 100, 1000)
        for i, (x, y) in enumerate(loader):
            lr = scheduler(i)
            lr_sched.adjust_learning_rate(lr, i)
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        False,
    ),
}

DOC = """\
# GFY412 lr-assignment

*Category: lr-scheduler · Severity: error · Removed by `graphify rewrite`: when the optimizer can read a tensor learning rate*

## What it flags

Assigning a learning rate inside the per-iteration region of a training loop: `group["lr"] = ...` while iterating
`opt.param_groups`, or `opt.param_groups[i]["lr"] = ...`, as hand-written warmup and decay schedules do. Also calls
that set it in code graphify cannot read (another file, a library), not removed by the rewrite: a scheduler called
for its effect (`scheduler(step)`, as open_clip's `cosine_lr` returns), and a helper named for it that is handed
an optimizer (`lr_sched.adjust_learning_rate(optimizer, it)`, `optimizer.step_and_update_lr()`). Not flagged: assignments in setup code, after the loop, or in an epoch loop whose step lives in an inner loop.
Augmented assignments (`group["lr"] *= 0.5`) are not detected yet.

## Why it breaks capture

With a Python-float learning rate the optimizer passes `lr` to its update kernels as a scalar argument, which
capture freezes into the graph. The assignment is host code: inside the captured region it runs once, at capture;
between replays it replaces a float the graph never reads. The run silently trains at the capture-time rate.

## How to fix

Make `lr` a one-element device tensor (with `capturable=True` for the Adam family, `fused=True` for SGD) and update
it in place outside the graph: `group["lr"].fill_(new_lr)` before each replay. `graphify rewrite` runs the
assignment eagerly before the replay, captures the step reading a device-tensor `lr`, and refreshes that tensor
from `group["lr"]` before each replay. A `LambdaLR` scheduler expresses the same schedule.

## Example

Flagged:
```python
for step, (x, y) in enumerate(loader):
    for group in opt.param_groups:
        group["lr"] = base_lr * min(1.0, (step + 1) / warmup)
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead (captured by hand):
```python
for step, (x, y) in enumerate(loader):
    for group in opt.param_groups:          # group["lr"] is a device tensor
        group["lr"].fill_(base_lr * min(1.0, (step + 1) / warmup))
    static_x.copy_(x); static_y.copy_(y)
    graph.replay()
```

## Suppress

Add `# graphify: ignore[GFY412]` to the flagged line.
"""
