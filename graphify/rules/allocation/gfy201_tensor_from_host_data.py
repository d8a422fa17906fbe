"""GFY201 tensor-from-host-data."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.devices import legacy_tensor_type
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.registry import rule

RULE = rule(
    "GFY201",
    "tensor-from-host-data",
    "in-loop-allocation",
    "error",
    "`torch.tensor`/`as_tensor`/`from_numpy` of host data: the value is frozen at capture",
    True,
    Fix(FixKind.DRAWN, Applicability.SAFE),
)


_FROM_HOST = {
    "tensor",
    "as_tensor",
    "from_numpy",
    "Tensor",
    "FloatTensor",
    "LongTensor",
    "IntTensor",
    "BoolTensor",
    "HalfTensor",
    "DoubleTensor",
    "ByteTensor",
}


def _host_data(expr, env) -> bool:
    """Values, not sizes: a list literal or something numpy built."""
    if isinstance(expr, (cst.List, cst.Tuple, cst.ListComp)):
        return True
    return isinstance(expr, cst.Call) and (env.qualify(expr.func) or "").startswith("numpy.")


def detect(ck):
    for call, site in ck.calls():
        env = site.env
        qual = env.qualify(call.func) or ""
        if not qual.startswith("torch.") and call.args and legacy_tensor_type(call.func, env) and _host_data(call.args[0].value, env):
            qual = "torch.Tensor"  # Tensor(np.random.normal(...)), Tensor = torch.cuda.FloatTensor
        if qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in _FROM_HOST:
            # Input preparation before the step (in the body, or in a helper such as get_batch() called
            # there) stays eager; anywhere else the value would be frozen at capture.
            removable = ck.before_gpu_work(call)
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` builds a tensor from host data inside the step",
                "build per-step inputs before the step and copy them into a static buffer; create constants once before the loop",
                removable,
            )


DOC = """\
# GFY201 tensor-from-host-data

*Category: in-loop-allocation · Severity: error · Removed by `graphify rewrite`: when built before the step's GPU work*

## What it flags

`torch.tensor(...)`, `torch.as_tensor(...)`, `torch.from_numpy(...)` and the legacy constructors (`torch.Tensor`,
`torch.FloatTensor`, `torch.LongTensor`, ...) inside the per-iteration region of a training or inference loop, with
or without `device=`: their argument is host data (numbers, lists, NumPy arrays, loop counters). Not flagged: the
same calls in setup code, and factories such as `torch.zeros(n, device=...)` (GFY202 covers changing arguments).

## Why it breaks capture

The host data reaches the GPU through a host-to-device copy out of a buffer that exists only for this call. A copy
from pageable host memory cannot be captured at all (`Cannot copy between CPU and CUDA tensors during CUDA graph
capture unless the CPU tensor is pinned`). Where it can (pinned memory), the graph records the copy with its source
address and replays it from there: every replay sees the capture step's value, or whatever that memory holds now.

## How to fix

Treat the value as an input of the step: build it eagerly before each replay and copy it into a static device
buffer with `copy_`; the captured step reads only the buffer. `graphify rewrite` does this when the tensor is built
before the step's first GPU work (in the loop body, or in a helper called there), and for an expression inside the
step's statements in the loop body (`z = Tensor(np.random.normal(0, 1, (n, d)))`) when what it reads is unchanged by
the step before it: it is built before the call, host draws in their order. Elsewhere, move it there by hand. Or keep the value on the device
and update it in place (`t.mul_(0.99)` inside the step replays correctly). Constants belong before the loop.

## Example

Flagged:
```python
for step, (x, y) in enumerate(loader):
    tau = torch.tensor(max(0.1, 1.0 - step / 10_000), device="cuda")
    loss = criterion(model(x) / tau, y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead (captured by hand):
```python
static_tau = torch.empty((), device="cuda")   # a static input, allocated before capture
for step, (x, y) in enumerate(loader):
    static_x.copy_(x); static_y.copy_(y)
    static_tau.copy_(torch.tensor(max(0.1, 1.0 - step / 10_000)))
    g.replay()                                 # the captured step divides by static_tau
```

## Suppress

Add `# graphify: ignore[GFY201]` to the flagged line.
"""
