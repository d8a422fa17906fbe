"""GFY004 tensor-numpy."""

from graphify.model import Applicability, Fix, FixKind
from graphify.rules.host_sync.shared import method_read_findings
from graphify.rules.registry import rule

RULE = rule(
    "GFY004",
    "tensor-numpy",
    "host-sync",
    "error",
    "`.numpy()` needs the tensor on the host",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def detect(ck):
    yield from method_read_findings(ck, RULE, "numpy", "needs the tensor on the host")


DOC = """\
# GFY004 tensor-numpy

*Category: host-sync · Severity: error · Removed by `graphify rewrite`: when the value only feeds host code*

## What it flags

`.numpy()` inside the per-iteration region of a training or inference loop, on any value graphify cannot show to
be a host value; usually as `t.detach().cpu().numpy()`, where the `.cpu()` is also reported (GFY003). Not flagged:
`.numpy()` on known host values or outside the step, and `torch.from_numpy` (see GFY201).

## Why it breaks capture

`.numpy()` only works on a CPU tensor: a CUDA tensor must first be copied to the host, a copy that waits for the GPU
and is illegal during stream capture. The array and whatever NumPy code consumes it are CPU work, which a graph does
not record: on replay only the GPU kernels run, so metrics computed from the array would be computed once, at
capture, and never again.

## How to fix

Compute metrics with torch ops on the device and convert after the loop, or every N steps outside the step. When the
array only feeds host code, `graphify rewrite` moves the conversion after `g.replay()` and applies it to the graph's
static output, so it runs eagerly on every iteration. If the array feeds GPU work of the same step, keep the
computation in torch.

## Example

Flagged:
```python
for x, y in loader:
    logits = model(x)
    loss = criterion(logits, y)
    loss.backward(); opt.step(); opt.zero_grad()
    hits += (logits.argmax(1).cpu().numpy() == y.cpu().numpy()).sum()
```
Instead:
```python
hits = torch.zeros((), dtype=torch.long, device="cuda")
for x, y in loader:
    logits = model(x)
    loss = criterion(logits, y)
    loss.backward(); opt.step(); opt.zero_grad()
    hits += (logits.argmax(1) == y).sum()   # in place, on the GPU
accuracy = hits.item() / len(loader.dataset)
```

## Suppress

Add `# graphify: ignore[GFY004]` to the flagged line.
"""
