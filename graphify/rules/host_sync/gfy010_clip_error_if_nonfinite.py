"""GFY010 clip-error-if-nonfinite."""

from graphify.analysis.checker import code_of
from graphify.rules.host_sync.shared import call_read
from graphify.rules.registry import rule

RULE = rule(
    "GFY010",
    "clip-error-if-nonfinite",
    "host-sync",
    "error",
    "`clip_grad_norm_(..., error_if_nonfinite=True)` checks the norm on the host",
    False,
)


def detect(ck):
    for call, site in ck.calls():
        if call_read(call, site.env) == "clip":
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` checks the norm on the host",
                "drop `error_if_nonfinite=True`; check the returned norm after the step instead",
            )


DOC = """\
# GFY010 clip-error-if-nonfinite

*Category: host-sync · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

`torch.nn.utils.clip_grad_norm_(..., error_if_nonfinite=True)` inside the per-iteration region of a training loop.
Not flagged: `clip_grad_norm_` with the default `error_if_nonfinite=False`, `clip_grad_value_`, and clipping outside
the step.

## Why it breaks capture

With `error_if_nonfinite=True`, `clip_grad_norm_` tests the total norm for NaN or infinity in a Python `if`, which
reads the norm on the host and waits for the GPU: a synchronization, illegal during stream capture. The raise is a
host branch, which a graph cannot take on replay. Without the flag the clipping is device work only (norms, a clamped
clip coefficient, in-place scaling) and captures fine.

## How to fix

Drop the flag and check the returned norm outside the step: accumulate a device flag (`bad |= ~norm.isfinite()`) and
read it every N steps or at the end of the epoch, or read the graph's static norm after `g.replay()`. Note that
such a check runs after the optimizer step, where the eager version raised before it. With AMP, `GradScaler` already
skips steps whose gradients are not finite. This is why the rule is not rewritable: the rewrite cannot keep the
raise-before-step semantics.

## Example

Flagged:
```python
for x, y in loader:
    criterion(model(x), y).backward()
    clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
    opt.step(); opt.zero_grad()
```
Instead:
```python
bad = torch.zeros((), dtype=torch.bool, device="cuda")
for x, y in loader:
    criterion(model(x), y).backward()
    norm = clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad()
    bad |= ~torch.isfinite(norm)
if bad.item():
    raise FloatingPointError("non-finite gradient norm in this epoch")
```

## Suppress

Add `# graphify: ignore[GFY010]` to the flagged line.
"""
