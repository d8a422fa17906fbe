"""GFY011 empty-cache-in-step."""

from graphify.model import Applicability, Fix, FixKind
from graphify.rules.host_sync.shared import call_read
from graphify.rules.registry import rule

RULE = rule(
    "GFY011",
    "empty-cache-in-step",
    "host-sync",
    "error",
    "`torch.cuda.empty_cache()` in the step: costly, and on some PyTorch versions it breaks capture",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def detect(ck):
    for call, site in ck.calls():
        if call_read(call, site.env) == "empty_cache":
            yield ck.finding(
                RULE,
                call,
                site,
                "`torch.cuda.empty_cache()` inside the step",
                "call it outside the training step, if at all",
                ck.host_read_removable(call, site),
            )


DOC = """\
# GFY011 empty-cache-in-step

*Category: host-sync · Severity: error · Removed by `graphify rewrite`: yes*

## What it flags

`torch.cuda.empty_cache()` inside the per-iteration region of a training or inference loop. Not flagged: calls
between epochs (in an epoch loop whose step lives in an inner loop), before the loop or after it.

## Why it breaks capture

Outside capture, `empty_cache()` waits for the cached blocks' pending events and returns the blocks to the driver
with `cudaFree`, which synchronizes the device. Neither may happen while a stream is capturing: older PyTorch
releases abort with an internal allocator assertion (`captures_underway.empty()`), recent ones tolerate the call.
Either way it cannot help a graphed loop: a captured step's memory lives in the graph's private pool, reserved while
the graph exists, which `empty_cache()` does not release.

## How to fix

Delete the call, or move it to where it does something: between epochs, or after a phase that allocated a lot of
memory eagerly. `graphify rewrite` takes it out of the captured step and runs it eagerly after `g.replay()`, where it
is legal; it has little to free there, so consider removing it.

## Example

Flagged:
```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    del loss
    torch.cuda.empty_cache()
```
Instead:
```python
for epoch in range(epochs):
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
    torch.cuda.empty_cache()   # once an epoch, if at all
```

## Suppress

Add `# graphify: ignore[GFY011]` to the flagged line.
"""
