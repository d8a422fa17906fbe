"""GFY002 tensor-tolist."""

from graphify.model import Applicability, Fix, FixKind
from graphify.rules.host_sync.shared import method_read_findings
from graphify.rules.registry import rule

RULE = rule(
    "GFY002",
    "tensor-tolist",
    "host-sync",
    "error",
    "`.tolist()` on a tensor copies it to the host and waits for the GPU",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def detect(ck):
    yield from method_read_findings(ck, RULE, "tolist", "waits for the GPU")


CASES = {
    "host-batch-item": (
        """
        loader = torch.utils.data.DataLoader(dataset, batch_size=8)
        with torch.no_grad():
            for imgs, caps in loader:
                out = model(imgs.to(device))
                refs = caps[0].tolist()
                hyps = out.argmax(-1).tolist()  # here
        """,
        """
        loader = torch.utils.data.DataLoader(dataset, batch_size=8)
        with torch.no_grad():
            for imgs, caps in loader:
                out = model(imgs.to(device))
                refs = caps[0].tolist()
        """,
        True,
    ),
}

DOC = """\
# GFY002 tensor-tolist

*Category: host-sync · Severity: error · Removed by `graphify rewrite`: when the value only feeds host code*

## What it flags

`.tolist()` on a value known to hold a tensor inside the per-iteration region of a training or inference loop
(typically predictions or per-sample losses collected into Python lists for metrics). Not flagged: `.tolist()` on
host data (NumPy arrays, lists), on items of a torch `DataLoader` that the step never moves to the device (they
are CPU tensors), or on tensors outside the step (after the loop, in the epoch loop).

## Why it breaks capture

`.tolist()` copies the whole tensor to host memory and builds Python objects from it, so the CPU must wait for the GPU
to finish computing it. That synchronization is illegal while a stream is being captured and invalidates the capture.
The Python list is also CPU work: a replay launches only the recorded kernels, so code that builds or extends a list
during capture would not run again on replay.

## How to fix

Accumulate on the device (`torch.cat`, a preallocated buffer indexed by step, running sums) and convert once after
the loop or epoch. When the list only feeds host code (metrics, logging), `graphify rewrite` moves the `.tolist()`
after `g.replay()` and reads the graph's static output instead. If the list drives GPU work in the same step, keep the
data as a tensor and use tensor ops.

## Example

Flagged:
```python
for x, y in loader:
    logits = model(x)
    loss = criterion(logits, y)
    loss.backward(); opt.step(); opt.zero_grad()
    preds.extend(logits.argmax(dim=1).tolist())
```
Instead:
```python
for x, y in loader:
    logits = model(x)
    loss = criterion(logits, y)
    loss.backward(); opt.step(); opt.zero_grad()
    correct += (logits.argmax(dim=1) == y).sum()   # a device tensor
accuracy = correct.item() / len(loader.dataset)
```

## Suppress

Add `# graphify: ignore[GFY002]` to the flagged line.
"""
