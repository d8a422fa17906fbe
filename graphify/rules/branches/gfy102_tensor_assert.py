"""GFY102 tensor-assert."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.rules.branches.shared import reads_tensor_value
from graphify.rules.registry import rule

RULE = rule(
    "GFY102", "tensor-assert", "data-dependent-branch", "error", "`assert` on a tensor value syncs, and is not re-checked on replay", False
)


def detect(ck):
    for node, site in ck.nodes():
        env = site.env
        if isinstance(node, cst.Assert) and env.is_tensor(node.test) and not reads_tensor_value(node.test, env):  # else GFY101
            yield ck.finding(
                RULE,
                node,
                site,
                f"assert on tensor value `{code_of(node.test)}`",
                "check after the step (outside the captured region), or drop the assert in the hot loop",
            )


DOC = """\
# GFY102 tensor-assert

*Category: data-dependent-branch · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

An `assert` whose test is a tensor value, inside the per-iteration region of a training or inference loop:
`assert torch.isfinite(loss)`, `assert (probs >= 0).all()`. Not flagged: asserts on host values
(`assert x.shape == y.shape`, `assert x.dtype == torch.float16`, `assert x.is_cuda`).

## Why it breaks capture

`assert` calls `bool()` on the tensor, which copies it to the host and waits for the GPU: a synchronization, illegal
during stream capture. Even if it were allowed, the check is Python code that runs once, at capture; replays would
never test the condition again, so a failure on a later step would go unnoticed.

## How to fix

Check on the device and look at the result outside the step: accumulate a flag (`ok &= torch.isfinite(loss)`) and
read it every N steps or after the epoch, or test the graph's static outputs after `g.replay()`. `torch._assert_async`
(a private API) checks on the device without a sync, but a failure aborts the CUDA context rather than raising a
Python error. Keep host-value asserts as they are; `python -O` removes all of them.

## Example

Flagged:
```python
for x, y in loader:
    loss = criterion(model(x), y)
    assert torch.isfinite(loss), "loss diverged"
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
finite = torch.ones((), dtype=torch.bool, device="cuda")
for x, y in loader:
    loss = criterion(model(x), y)
    finite &= torch.isfinite(loss)
    loss.backward(); opt.step(); opt.zero_grad()
assert finite.item(), "loss diverged during this epoch"
```

## Suppress

Add `# graphify: ignore[GFY102]` to the flagged line.
"""
