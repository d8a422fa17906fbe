"""GFY101 tensor-condition."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.rules.branches.shared import reads_tensor_value
from graphify.rules.registry import rule

RULE = rule(
    "GFY101",
    "tensor-condition",
    "data-dependent-branch",
    "error",
    "`if`/`while` on a tensor value: the graph records only the branch taken at capture",
    False,
)


def detect(ck):
    for node, site in ck.nodes():
        env = site.env
        if isinstance(node, (cst.If, cst.While)) and env.is_tensor(node.test):
            yield ck.finding(
                RULE,
                node,
                site,
                f"branch on tensor value `{code_of(node.test)}`",
                "compute both sides and select with `torch.where`, or use `torch.cond`; or move the check after the step",
            )
        elif isinstance(node, (cst.If, cst.While, cst.Assert)) and reads_tensor_value(node.test, env):
            yield ck.finding(
                RULE,
                node,
                site,
                f"branch on `{code_of(node.test)}`, a value read from a tensor on the host",
                "check after the step, outside the captured region, or keep the test on the device (`torch.where`)",
            )


CASES = {
    "reduced-loss-dict": (
        """
        import math
        for x, y in loader:
            loss_dict = criterion(model(x), y)
            losses = sum(loss_dict[k] for k in loss_dict.keys())
            losses.backward(); opt.step(); opt.zero_grad()
            reduced = utils.reduce_dict(loss_dict)
            scaled = {k: v * 2 for k, v in reduced.items()}
            loss_value = sum(scaled.values()).item()
            if not math.isfinite(loss_value):  # here
                break
        """,
        """
        import math
        for x, y in loader:
            loss_dict = criterion(model(x), y)
            losses = sum(loss_dict[k] for k in loss_dict.keys())
            losses.backward(); opt.step(); opt.zero_grad()
            summary = utils.summarize(loss_dict)
            loss_value = sum(summary.values())
            if not math.isfinite(loss_value):
                break
        """,
        False,
    ),
    "host-ints-converted-from-a-tensor": (
        """
        times = torch.linspace(0, 99, 10).int()
        with torch.no_grad():
            for t in times:
                x = model(x)
                if t < 50:  # here
                    x = x * 0.5
        """,
        """
        times = torch.linspace(0, 99, 10)
        times = list(reversed(times.int().tolist()))
        pairs = list(zip(times[:-1], times[1:]))
        with torch.no_grad():
            for t, t_next in pairs:
                x = model(x)
                if t_next < 0:
                    continue
        """,
        False,
    ),
}

DOC = """\
# GFY101 tensor-condition

*Category: data-dependent-branch · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

An `if` or `while` whose condition is a tensor value, inside the per-iteration region of a training or inference
loop: `if loss > threshold:`, `if torch.isnan(loss):`, `if (grad_norm > 10).any():`, `while err.abs().max() > tol:`.
Not flagged: conditions on host values (`if step % 100 == 0:`, `if x.shape[0] < 2:`, `if loss is None:`), which
other rules judge by what they guard (GFY501, GFY502).

## Why it breaks capture

Python evaluates the condition with `bool(tensor)`, which copies the value to the host and waits for the GPU: a
synchronization, illegal during stream capture. And a graph has no branches of its own: it records the kernels of
whichever path Python took during capture and replays exactly those, whatever the data says on later steps.

## How to fix

Compute both outcomes and select on the device: `torch.where(cond, a, b)`, multiply an update by a 0/1 mask,
`torch.clamp`. For a real choice between two computations, `torch.cond(pred, true_fn, false_fn)` is recorded as a
CUDA conditional node under eager capture in recent PyTorch. A decision that may stay on the host (stop training,
skip logging) can be taken after the replay from the graph's static outputs.

## Example

Flagged:
```python
for x, y in loader:
    loss = criterion(model(x), y)
    if loss > 10.0:
        loss = loss * 0.1
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss = torch.where(loss > 10.0, loss * 0.1, loss)
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY101]` to the flagged line.
"""
