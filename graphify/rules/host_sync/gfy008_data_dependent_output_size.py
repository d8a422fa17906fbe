"""GFY008 data-dependent-output-size."""

from graphify.analysis.checker import code_of
from graphify.rules.host_sync.shared import call_read, method_read
from graphify.rules.host_sync.host_tensors import host_batch_names
from graphify.rules.registry import rule

# Sized from data: a dynamic shape first (the sync follows from it), so its category is dynamic-shape.
RULE = rule(
    "GFY008",
    "data-dependent-output-size",
    "dynamic-shape",
    "error",
    "`nonzero`, `unique`, `masked_select`, one-argument `where` size their output from data",
    False,
)


def detect(ck):
    host_batch = host_batch_names(ck)
    for call, site in ck.calls():
        if method_read(ck, call, site, host_batch) == "dynamic":
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` has a data-dependent output size",
                "use fixed-size alternatives (`torch.where(mask, x, 0)`, masks multiplied in) or move this out of the step",
            )
        if call_read(call, site.env) == "dynamic":
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` has a data-dependent output size",
                "use fixed-size alternatives (three-argument `torch.where`, masking) or move this out of the step",
            )


DOC = """\
# GFY008 data-dependent-output-size

*Category: dynamic-shape · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

Calls whose output size depends on tensor values, inside the per-iteration region of a training or inference loop:
`nonzero`, `argwhere`, `unique`, `unique_consecutive` and `masked_select` (as `torch.*` functions or tensor
methods), and `torch.where(cond)` with a single argument. Not flagged: three-argument `torch.where(cond, a, b)`,
`torch.nonzero_static(..., size=k)`, `masked_fill`, `topk` with a fixed `k`, and calls outside the step.

## Why it breaks capture

The number of output elements is known only once the GPU has looked at the data, so PyTorch copies the count to the
host and waits for it before it can allocate the result: a synchronization, illegal during stream capture. A graph
also replays fixed allocations and fixed kernel launch sizes, so even a captured count would be the capture step's
count on every replay.

## How to fix

Keep full, fixed shapes and carry the selection as a mask: `torch.where(m, x, 0)`, `x.masked_fill(~m, 0)`,
`(x * m).sum() / m.sum().clamp_min(1)`, `ignore_index=` in the loss. Where you need indices, bound their number and
pad: `torch.nonzero_static(m, size=k, fill_value=-1)`. If the step cannot avoid the op, capture only the parts
before and after it (`torch.cuda.make_graphed_callables`) and run it eagerly.

## Example

Flagged:
```python
for x, y in loader:
    logits = model(x)
    keep = torch.nonzero(y != IGNORE).squeeze(1)
    loss = F.cross_entropy(logits[keep], y[keep])
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
for x, y in loader:
    logits = model(x)
    loss = F.cross_entropy(logits, y, ignore_index=IGNORE)   # shapes stay fixed
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY008]` to the flagged line.
"""
