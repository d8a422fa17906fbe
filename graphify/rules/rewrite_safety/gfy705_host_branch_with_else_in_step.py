"""GFY705 host-branch-with-else-in-step: decided by the planner (graphify/plan/whole.py), no pattern of its own."""

from graphify.model import Fix
from graphify.rules.registry import rule

RULE = rule(
    "GFY705",
    "host-branch-with-else-in-step",
    "rewrite-safety",
    "error",
    "a host `if` inside the step with an `elif`, on one line, with host statements in its `else`, or alone binding a value read after the step; one graph per outcome is not built for it",
    False,
    Fix(advice="write the branch as `if`/`else` whose branches only launch GPU work, or move it out of the step"),
)


DOC = """\
# GFY705 host-branch-with-else-in-step

*Category: rewrite-safety · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

A host `if` inside the step, between the forward pass and the last optimizer step, of a shape the rewrite
cannot key: a branch on one line, a host statement of a branch that binds what the step reads and is more
than a binding (a call), or an `if` that alone binds a value the loop reads after the step (`if step % 2
== 0: ae_loss = ...`, then `print(ae_loss.item())` every step). Reported by the rewrite planner where it
refuses the loop. Not flagged: an `if`/`elif`/`else` chain on host conditions whose branches launch GPU
work (`if (i + 1) % k == 0:`, `if use_amp: ... else: ...`): every test's outcome keys the graph, and host
statements of any branch that the step does not read (`losses.append(loss.item())`) run after the replay
under the same tests, in the same `with torch.autocast(...)` block if they stood in one.

## Why it breaks capture

A host statement whose result the step reads cannot move after the replay: captured, its call runs once
and every replay uses its first value. A value bound only in the branch keeps an earlier step's value on
the steps that skip it, which a captured step cannot return; the model alone is graphed instead.

## How to fix

Compute the host value before the loop (a value fixed while it runs keys the graph), or bind it always.

## Example

Flagged:
```python
for epoch in range(epochs):
    for x, y in loader:
        out = model(x)
        if hard_mining:
            k = mining_schedule(epoch)
            loss = (out - y).pow(2).flatten().topk(k).values.mean()
        else:
            loss = F.mse_loss(out, y)
        loss.backward(); opt.step(); opt.zero_grad()
```
Instead (`k` fixed per epoch):
```python
for epoch in range(epochs):
    k = mining_schedule(epoch)
    for x, y in loader:
        out = model(x)
        if hard_mining:
            loss = (out - y).pow(2).flatten().topk(k).values.mean()
        else:
            loss = F.mse_loss(out, y)
        loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

`# graphify: ignore[GFY705]` hides the diagnostic from `check`; the rewrite still leaves the loop alone.
"""
