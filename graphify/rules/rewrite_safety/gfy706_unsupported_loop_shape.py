"""GFY706 unsupported-loop-shape: decided by the planner (graphify/plan/), no pattern of its own."""

from graphify.model import Fix
from graphify.rules.registry import rule

RULE = rule(
    "GFY706",
    "unsupported-loop-shape",
    "rewrite-safety",
    "error",
    "the loop's shape is not one the rewrite handles (`else:` clause, step outside the loop body, GradScaler step before backward, a function defined in the loop)",
    False,
    Fix(advice="keep the step in the loop body (not in functions defined in the loop), and `else:` logic after the loop"),
)


DOC = """\
# GFY706 unsupported-loop-shape

*Category: rewrite-safety · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

A training or inference loop whose shape the rewrite does not handle: a loop with an `else:` clause, a step
that is not in the loop body itself, a `GradScaler.step()` before the backward pass, or in an `elif`/`else` branch with it (in the `if`'s own branch,
`if use_amp: scaler.scale(loss).backward(); scaler.step(opt)`, it runs after the replay), a function or lambda
defined inside the loop (a closure reads the loop's names when called, not through the step's inputs), an
assignment expression (`:=`) in the loop body, a loop target that is an item or attribute (`for cur["x"] in
data`: the step would read the batch through the object), or nothing left to capture once host statements move out. Reported by the rewrite planner where it refuses the loop.
It is also the reason partial capture gives when the loop's models cannot be graphed on their own: a model
called through an attribute or with keyword tensors only, a host value among its positional arguments, a
helper handed the model that does more with it than call it, or no backward pass in the loop body.

## Why it breaks capture

The rewrite turns the statements from the first model call to the last backward or optimizer step into one
captured function. Without such a span in the loop body, there is no step to capture safely.

## How to fix

Keep the step in the loop body (or in one function the loop calls), and the `else:` logic after the loop.

## Example

Flagged:
```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
else:
    print("done")
```
Instead:
```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
print("done")
```

## Suppress

`# graphify: ignore[GFY706]` hides the diagnostic from `check`; the rewrite still leaves the loop alone.
"""
