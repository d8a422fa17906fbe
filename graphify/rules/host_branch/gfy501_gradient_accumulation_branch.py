"""GFY501 gradient-accumulation-branch."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.host_branch.shared import accumulates, accumulation, host_if
from graphify.rules.registry import rule

RULE = rule(
    "GFY501",
    "gradient-accumulation-branch",
    "host-branch",
    "error",
    "an optimizer step or `zero_grad` under a step-counter condition (gradient accumulation)",
    True,
    Fix(FixKind.IN_PLACE, Applicability.SAFE),
)


def detect(ck):
    for node, site in ck.nodes():
        if isinstance(node, cst.WithItem) and accumulates(node, site.env):
            yield ck.finding(
                RULE,
                node,
                site,
                f"`{code_of(node.item)}` steps and zeroes the optimizer only when an accumulation cycle ends",
                "capture one graph per outcome of the accumulation condition, or accumulate by hand with `step % k`",
                False,
            )
        elif host_if(node, site) and (found := accumulation(node, site, ck)) is not None:
            message, fix, removable = found
            yield ck.finding(RULE, node, site, message, fix, removable)


CASES = {
    "early-return-in-called-step": (
        """
        def train_step(x, y, pending):
            with torch.no_grad():
                pending.append(model(x))
            if len(pending) < 4:  # here
                return pending
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
            return []
        pending = []
        for x, y in loader:
            pending = train_step(x, y, pending)
        """,
        """
        def train_step(x, y, pending):
            if x is None:
                return pending
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
            return []
        pending = []
        for x, y in loader:
            pending = train_step(x, y, pending)
        """,
        False,
    ),
    "accelerate-accumulate": (
        """
        for x, y in loader:
            with accelerator.accumulate(model):  # here
                loss = criterion(model(x), y)
                accelerator.backward(loss)
                opt.step(); opt.zero_grad()
        """,
        """
        for x, y in loader:
            with accelerator.autocast():
                loss = criterion(model(x), y)
            accelerator.backward(loss)
            opt.step(); opt.zero_grad()
        """,
        False,
    ),
    "step-in-called-function": (
        """
        def update(loss, do_step):
            loss.backward()
            if do_step:  # here
                opt.step(); opt.zero_grad()
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % 4 == 0
            if not last:  # here
                with model.no_sync():
                    update(criterion(model(x), y), last)
            else:
                update(criterion(model(x), y), last)
        """,
        """
        def update(loss):
            loss.backward()
            opt.step(); opt.zero_grad()
        for x, y in loader:
            if args.no_sync:
                with model.no_sync():
                    update(criterion(model(x), y))
            else:
                update(criterion(model(x), y))
        """,
        False,
    ),
    "continue-before-step": (
        """
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            if (i + 1) % 4 != 0:  # here
                continue
            opt.step(); opt.zero_grad()
        """,
        """
        for i, (x, y) in enumerate(loader):
            if i < resume_step:
                continue
            loss = criterion(model(x), y)
            loss.backward()
            opt.step(); opt.zero_grad()
        """,
        False,
    ),
}

DOC = """\
# GFY501 gradient-accumulation-branch

*Category: host-branch · Severity: error · Removed by `graphify rewrite`: when the condition is a modulo (`i % k`)*

## What it flags

`opt.step()`, `scaler.step(opt)` or `zero_grad()` under an `if` on a host value (in practice a step counter) inside
the per-iteration region of a training loop, the shape of gradient accumulation: `if (i + 1) % accum_steps == 0:`;
an `if` on such a value around a call of a function that steps the optimizer; `if not need_update: continue` after the
backward pass and before the optimizer step; in a function the step calls, `if len(pending) < k: return` after GPU
work and before that function steps the optimizer, on state the loop hands back each step (not removed by the
rewrite); and `with accelerator.accumulate(model):`, whose prepared optimizer steps
only when a cycle ends. In a called function, a parameter counts as host state of the step when its argument does.
Not flagged: a `continue` before the step's first forward pass (skipping iterations when resuming), conditions on
configuration the loop never changes, unconditional steps, per-epoch work in an epoch loop, and conditions on tensor
values (GFY101).

## Why it breaks capture

A graph replays one fixed sequence of kernels. Capturing a single iteration records the micro-step either with the
optimizer update or without it, depending on the counter's value at capture, and every replay repeats that choice:
the weights are then updated on every micro-batch, or never. The counter test is host code and is not replayed.

## How to fix

Capture one graph per outcome of the condition, sharing one memory pool (`pool=g1.pool()`): one that accumulates
gradients, one that accumulates, steps and zeroes the gradients in place (`zero_grad(set_to_none=False)`); decide on
the host which one to replay. `graphify rewrite` does this when the condition is a modulo of a step counter.
Alternatively, capture a whole accumulation cycle as one graph, with static input buffers for each micro-batch.

## Example

Flagged:
```python
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / accum_steps
    loss.backward()
    if (i + 1) % accum_steps == 0:
        opt.step(); opt.zero_grad()
```
Instead (captured by hand):
```python
for i, (x, y) in enumerate(loader):
    static_x.copy_(x); static_y.copy_(y)
    if (i + 1) % accum_steps == 0:
        step_graph.replay()    # forward, backward, opt.step(), opt.zero_grad(set_to_none=False)
    else:
        accum_graph.replay()   # forward, backward into the same static .grad tensors
```

## Suppress

Add `# graphify: ignore[GFY501]` to the flagged line.
"""
