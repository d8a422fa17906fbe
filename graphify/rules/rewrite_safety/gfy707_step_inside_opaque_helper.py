"""GFY707 step-inside-opaque-helper."""

import libcst as cst

from graphify.analysis.calls import is_delegated_step
from graphify.analysis.checker import code_of
from graphify.analysis.vocabulary import SCALER
from graphify.rules.registry import rule

RULE = rule(
    "GFY707",
    "step-inside-opaque-helper",
    "rewrite-safety",
    "error",
    "the loss and the optimizer are handed to a callable defined elsewhere, which runs the step out of sight",
    False,
)


def detect(ck):
    for node, site in ck.nodes():
        if isinstance(node, cst.Call) and is_delegated_step(node, site.env) and site.env.kind_of(node.func) != SCALER:
            yield ck.finding(
                RULE,
                node,
                site,
                f"`{code_of(node.func)}(...)` is handed the loss and the optimizer; what it runs is not visible",
                "call `loss.backward()` and `optimizer.step()` in the loop, or in a function of the checked files",
                order=(4,),
            )


DOC = """\
# GFY707 step-inside-opaque-helper

*Category: rewrite-safety · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

A call, inside the per-iteration region of a training loop, that is handed both the loss tensor and the
optimizer and is defined outside the checked files: `trainer_utils.backward_and_step(loss, optimizer)`,
`apply_update(loss, opt, clip=1.0)`. graphify follows functions of the checked files, methods of the
enclosing class and local closures; this one it cannot read.

## Why it breaks capture

The backward pass and the optimizer step happen inside code whose host work is unknown: it may read the
gradient norm, skip steps on overflow, log, or count steps on the host. A rewrite that captured it could
freeze any of those, so graphify neither calls the loop capturable nor rewrites it.

## How to fix

Call `loss.backward()` and `optimizer.step()` in the loop, or keep the helper in a file that is checked with
the loop (`graphify check train.py helpers.py`), so its body is analysed like the rest of the step.

## Example

Flagged:
```python
from trainer_utils import backward_and_step

for x, y in loader:
    loss = criterion(model(x), y)
    backward_and_step(loss, opt)
```
Instead:
```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY707]` to the flagged line; the rewrite still leaves the loop alone.
"""
