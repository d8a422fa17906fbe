"""GFY202 factory-with-step-values."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.calls import iter_nodes
from graphify.rules.registry import rule

RULE = rule(
    "GFY202",
    "factory-with-step-values",
    "in-loop-allocation",
    "error",
    "a tensor factory whose size or fill value changes per step is frozen at capture",
    False,
)


_FACTORIES = {"zeros", "ones", "full", "empty", "arange", "linspace", "logspace", "randn", "rand", "randint", "randperm", "eye", "normal"}


def detect(ck):
    for call, site in ck.calls():
        qual = site.env.qualify(call.func) or ""
        if qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in _FACTORIES:
            used = sorted({n.value for a in call.args for n in iter_nodes(a.value) if isinstance(n, cst.Name) and n.value in ck.counters})
            if used:
                yield ck.finding(
                    RULE,
                    call,
                    site,
                    f"`{code_of(call)}` depends on per-step host value `{used[0]}`, frozen at capture",
                    f"keep `{used[0]}` in a device tensor updated with `fill_()` before each replay",
                )


DOC = """\
# GFY202 factory-with-step-values

*Category: in-loop-allocation · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

A tensor factory (`torch.zeros`, `ones`, `empty`, `full`, `arange`, `linspace`, `logspace`, `eye`, `rand`,
`randn`, `randint`, `randperm`, `normal`) inside the per-iteration region of a training or inference loop, with an
argument that uses a counter of the step loop (`step` in `for step, batch in enumerate(loader)`) or a host value
computed from one in the loop body. Not flagged: arguments that are constants, set before the loop or taken from
the batch's shape (`x.shape[0]`, fixed when batches are), `*_like` factories, and factories in setup code.

## Why it breaks capture

A factory's size decides the allocation and the kernel's launch configuration, and its fill value is passed to the
kernel as an argument. Capture records both as they were on the capture step, and every replay refills the same
memory with the same size and value. Nothing raises: the step silently runs with stale values (and a changing size
could not be replayed at all).

## How to fix

Keep per-step values on the device and update them in place, so that the update is part of what the graph replays
(`scale.mul_(0.99)`, `step_t += 1`), or make them a static input buffer refreshed with `copy_` before each replay.
For sizes, allocate the largest size once and mask or slice with fixed bounds. The rewrite cannot tell how a value
feeds the factory, so it leaves this to you.

## Example

Flagged:
```python
for step, (x, y) in enumerate(loader):
    sigma = torch.full((x.shape[0], 1), 0.1 * 0.99 ** step, device="cuda")
    loss = criterion(model(x + sigma * torch.randn_like(x)), y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
sigma = torch.full((), 0.1, device="cuda")    # on the device, before the loop
for x, y in loader:
    loss = criterion(model(x + sigma * torch.randn_like(x)), y)
    loss.backward(); opt.step(); opt.zero_grad()
    sigma.mul_(0.99)                           # in place: every replay repeats it
```

## Suppress

Add `# graphify: ignore[GFY202]` to the flagged line.
"""
