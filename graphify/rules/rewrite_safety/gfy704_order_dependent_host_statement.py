"""GFY704 order-dependent-host-statement: decided by the planner (graphify/plan/dataflow.py, whole.py), no pattern of its own."""

from graphify.model import Fix
from graphify.rules.registry import rule

RULE = rule(
    "GFY704",
    "order-dependent-host-statement",
    "rewrite-safety",
    "error",
    "a host statement inside the step cannot move out of it without changing the order of effects",
    False,
    Fix(advice="put host work before the forward pass or after the optimizer step"),
)


DOC = """\
# GFY704 order-dependent-host-statement

*Category: rewrite-safety · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

A statement between the step's first model call and its last backward or optimizer step that cannot be
captured (it is host work) and cannot be moved after the step without changing the order of effects: a call on
an object the analysis does not know (`self.opt.zero_grad()` where `self.opt` was built elsewhere), a method that
may change state the later statements use, random numbers drawn on the device between captured statements,
an exit (`break`, `return`, `yield`, `raise`) between captured statements, or inside one (the step function would
return, not the loop's), or after a `zero_grad()` that would be pulled into the step; a read of parameters,
gradients, optimizer state or a scaler's scale (`model.weight.clone()`, `p.grad.norm()`, `opt.state`,
`scaler.get_scale()`) that a later optimizer step, clipping or scaler update changes in place; a change of
grad mode or of the random seed between captured statements.
Reported by the rewrite planner where it refuses the loop. Not flagged: logging, `.item()` reads, appending to
lists the step does not read, and batch fetches that touch nothing the step reads.

## Why it breaks capture

The rewrite keeps host statements out of the graph and runs them after the replay. That is the same training
only when the statement and the rest of the step do not see each other's effects; a `zero_grad()` moved after
the step would clear gradients at a different point.

## How to fix

Put host work before the forward pass or after the optimizer step, or use objects graphify recognises
(optimizers built from `torch.optim`, schedulers, loggers).

## Example

Flagged:
```python
for x, y in loader:
    out = model(x)
    trainer.reset_grads()
    loss = criterion(out, y)
    loss.backward(); opt.step()
```
Instead:
```python
for x, y in loader:
    trainer.reset_grads()
    out = model(x)
    loss = criterion(out, y)
    loss.backward(); opt.step()
```

## Suppress

`# graphify: ignore[GFY704]` hides the diagnostic from `check`; the rewrite still leaves the loop alone.
"""
