"""GFY005 tensor-to-python-scalar."""

from graphify.analysis.checker import code_of
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.host_sync.shared import READ_AFTER, call_read
from graphify.rules.registry import rule

RULE = rule(
    "GFY005",
    "tensor-to-python-scalar",
    "host-sync",
    "error",
    "`float()`, `int()`, `bool()` of a tensor read its value on the host",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def detect(ck):
    for call, site in ck.calls():
        if call_read(call, site.env) == "scalar":
            yield ck.finding(
                RULE, call, site, f"`{code_of(call)}` reads a tensor on the host", READ_AFTER, ck.host_read_removable(call, site)
            )


DOC = """\
# GFY005 tensor-to-python-scalar

*Category: host-sync · Severity: error · Removed by `graphify rewrite`: when the value only feeds host code*

## What it flags

`float(t)`, `int(t)`, `bool(t)` and `complex(t)` where `t` is known to hold a tensor, inside the per-iteration region of a
training or inference loop. Not flagged: the same calls on host values (`float(lr)` of a Python float,
`int(x.shape[0])`, `len(batch)`), and calls outside the step. An `if` or `while` on a tensor is GFY101, `and`/`or`/
`not` and the ternary are GFY103.

## Why it breaks capture

Converting a CUDA tensor to a Python number goes through `.item()`: the value is copied to the host and the CPU waits
for the GPU. That synchronization is illegal during stream capture and invalidates it. Even if it were allowed, the
number would be read once, at capture, and every replay would reuse whatever host code did with it.

## How to fix

Keep the value as a tensor for as long as it is used in the step. When the number only feeds host code (a log line,
a Python accumulator, an early-stopping check), `graphify rewrite` moves the conversion after `g.replay()` and reads
the graph's static output. When it feeds GPU work of the same step, use tensor arithmetic instead of a host number.

## Example

Flagged:
```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    epoch_loss += float(loss)
```
Instead:
```python
epoch_loss = torch.zeros((), device="cuda")
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    epoch_loss += loss.detach()
log(epoch=epoch, loss=float(epoch_loss) / len(loader))   # after the loop
```

## Suppress

Add `# graphify: ignore[GFY005]` to the flagged line.
"""
