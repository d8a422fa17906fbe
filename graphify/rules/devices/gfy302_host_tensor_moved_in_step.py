"""GFY302 host-tensor-moved-in-step."""

from graphify.analysis.checker import code_of
from graphify.analysis.devices import device_for_factory
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.devices.shared import device_copies
from graphify.rules.registry import rule

RULE = rule(
    "GFY302",
    "host-tensor-moved-in-step",
    "cross-device",
    "error",
    "a tensor created on the host inside the step is copied to the device",
    True,
    Fix(FixKind.ON_DEVICE, Applicability.SAFE),
)


def detect(ck):
    for call, site, from_host_factory in device_copies(ck):
        if from_host_factory:
            in_file = site.block.module is ck.loop.module  # the rewrite edits the loop's own file only
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` creates a tensor on the host and copies it every step",
                "create it directly on the device (`device=`), or once before the loop",
                removable=in_file and device_for_factory(call, site.env) is not None,
                order=(2, ck.position(call)),
            )


DOC = """\
# GFY302 host-tensor-moved-in-step

*Category: cross-device · Severity: error · Removed by `graphify rewrite`: when the factory is `zeros`, `ones`, `full`, `empty` or `eye` chained to the copy in the rewritten file*

## What it flags

`.cuda()` or `.to(device)` inside the per-iteration region of a training or inference loop, applied to a tensor
factory called without `device=` (`zeros`, `ones`, `full`, `empty`, `arange`, `linspace`, `eye`, `rand`, `randn`,
`randint`, `randperm`, `zeros_like`, `ones_like`), directly or through a name assigned from one. Not flagged: loader
data and tensors derived from a factory (`torch.arange(n).view(1, -1).cuda()`; GFY301 reports both), host data
(GFY201), and tensors created on the device directly.

## Why it breaks capture

The CPU computation that builds the tensor is not recorded; only the copy is, as a memcpy from the host address the
tensor had at capture. Every replay copies those same bytes (or freed memory), so a value meant to change per step,
such as CPU random numbers, is frozen. A copy out of pageable memory cannot be captured at all.

## How to fix

Create the tensor on the device (`torch.arange(n, device=device)`), or build constants once before the
loop. `graphify rewrite` does the first for `zeros`, `ones`, `full`, `empty` and `eye` chained to the copy
(`torch.zeros(n, h).to(device)` becomes `torch.zeros(n, h, device=device)`, the same tensor), also in
the model's `forward` when it is in the same file. Random factories are not moved to the device:
`torch.randn(b, device=device)` draws from the GPU generator, a different training than the CPU draws it
replaces. Instead, a factory written in the loop body's step (`z = torch.randn(b, n).to(device)`) is drawn
before the step call, in the same order as the step's other host draws, and the step receives it as an input
refreshed before each replay. That needs what it reads unchanged by the step before it, no other host draw
left in the step, and one such expression per statement; otherwise (and inside functions the step calls)
it stays a breaker.

## Example

Flagged:
```python
for x, y in loader:
    pos = torch.arange(x.shape[1]).cuda()
    loss = criterion(model(x, positions=pos), y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
pos = torch.arange(SEQ_LEN, device="cuda")   # constant: built once, on the device
for x, y in loader:
    loss = criterion(model(x, positions=pos), y)
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY302]` to the flagged line.
"""
