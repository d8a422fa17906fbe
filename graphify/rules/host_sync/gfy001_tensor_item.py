"""GFY001 tensor-item."""

from graphify.model import Applicability, Fix, FixKind
from graphify.rules.host_sync.shared import method_read_findings
from graphify.rules.registry import rule

RULE = rule(
    "GFY001",
    "tensor-item",
    "host-sync",
    "error",
    "`.item()` on a tensor copies it to the host and waits for the GPU",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def detect(ck):
    yield from method_read_findings(ck, RULE, "item", "waits for the GPU")


CASES = {
    "nested-loop-of-inference-step": (
        """
        with torch.no_grad():
            for x, y in loader:
                scores = model(x)
                for row in scores:
                    best = row.max().item()  # here
        """,
        """
        with torch.no_grad():
            for x, y in loader:
                scores = model(x)
        for row in scores:
            best = row.max().item()
        """,
        True,
    ),
}

DOC = """\
# GFY001 tensor-item

*Category: host-sync · Severity: error · Removed by `graphify rewrite`: when the value only feeds host code*

## What it flags

`.item()` inside the per-iteration region of a training or inference loop, including the functions that region
calls, on any value graphify cannot show to be a host value (in training code the receiver is nearly always a
tensor: a loss, a model output, an accumulated metric). Not flagged: `.item()` on known host values or known
objects (optimizers, schedulers), and `.item()` in setup code, after the loop, or in an epoch loop whose step lives
in an inner loop.

## Why it breaks capture

`.item()` copies one element to host memory and blocks the CPU until the GPU has produced it. During stream capture
no kernel runs, so there is nothing to wait for: the synchronizing copy is illegal and CUDA invalidates the capture
(`operation not permitted when stream is capturing`). Even uncaptured, one sync per step stops the CPU from queueing
work ahead of the GPU, which is the launch overhead graphs exist to remove.

## How to fix

Keep per-step values on the device (`running += loss.detach()`) and read them rarely, outside the step. When the
result only feeds host code (logging, Python accumulators, lists, early-stopping checks), `graphify rewrite` moves the
read after `g.replay()` and points it at the graph's static output (`static_loss.item()`); that still syncs once per
step, but outside the graph. When later GPU work of the same step uses the value (a scale factor, a branch), the
rewrite cannot help: express the dependency with tensor ops (`torch.where`, `torch.clamp`, multiplication by a mask).

## Example

Flagged:
```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    total += loss.item()
```
Instead:
```python
total = torch.zeros((), device="cuda")
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    total += loss.detach()
print(total.item() / len(loader))   # once, after the loop
```

## Suppress

Add `# graphify: ignore[GFY001]` to the flagged line.
"""
