"""GFY701 per-step-host-value."""

import libcst as cst

from graphify.analysis.calls import iter_nodes
from graphify.analysis.checker import code_of
from graphify.model import Fix
from graphify.rules.registry import rule
from graphify.rules.rewrite_safety.shared import after_first_gpu_work

RULE = rule(
    "GFY701",
    "per-step-host-value",
    "rewrite-safety",
    "error",
    "the step reads a Python value that changes between steps; capture would freeze it",
    False,
    Fix(advice="keep the value on the device and update it in place before the step (`t.fill_(value)`), or make it constant for the loop"),
)


def _is_number(name: str, ck) -> bool:
    """A counter that holds a number (`step`, `t = T - 1 - i`), not index arrays sliced from it."""
    values = ck.body_env.values_of(name)
    return not any(isinstance(n, (cst.Subscript, cst.Call)) for v in values for n in iter_nodes(v))


def _counter_index(node: cst.Subscript, ck) -> cst.BaseExpression | None:
    """The index of `buf[step]`, `alphas[t]` when it is a per-step host counter of the loop."""
    for el in node.slice:
        if isinstance(el.slice, cst.Index):
            names = [n.value for n in iter_nodes(el.slice.value) if isinstance(n, cst.Name)]
            if names and all(n in ck.counters and _is_number(n, ck) for n in names):
                return el.slice.value
    return None


def detect(ck):
    """A tensor read or written at a slot chosen by the loop's counter: capture fixes the slot. Reads
    that build the step's inputs before its first GPU work stay eager in the rewrite and are not reported."""
    for node, site in ck.nodes():
        if not isinstance(node, cst.Subscript) or site.block is not ck.region.body_block or not site.env.is_tensor(node.value):
            continue
        index = _counter_index(node, ck)
        written = bool(site.ancestors) and isinstance(site.ancestors[-1], cst.AssignTarget)
        if index is not None and (written or after_first_gpu_work(ck, node, site)):
            yield ck.finding(
                RULE,
                node,
                site,
                f"`{code_of(node)}` is indexed by `{code_of(index)}`, a host value that changes between steps; capture would freeze it",
                RULE.fix.advice,
                order=(3,),
            )


CASES = {
    "counter-index": (
        """
        losses = torch.zeros(100)
        for step in range(100):
            x, y = next(batches)
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            losses[step] = loss.detach()  # here
        """,
        """
        xs, ys = torch.randn(100, 8, 4), torch.randint(0, 2, (100, 8))
        for step in range(100):
            x, y = xs[step], ys[step]
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        False,
    ),
    "host-helper-feeds-step": (
        """
        def accuracy(out, y):
            return (out.argmax(1) == y).float().mean()
        for x, y in loader:
            out = model(x)
            acc = accuracy(out, y)
            meter.update(acc)
            w = lookup(table)  # here
            loss = criterion(out, y) * w
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def accuracy(out, y):
            return (out.argmax(1) == y).float().mean()
        for x, y in loader:
            out = model(x)
            acc = accuracy(out, y)
            meter.update(acc)
            loss = criterion(out, y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        False,
    ),
}

DOC = """\
# GFY701 per-step-host-value

*Category: rewrite-safety · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

A Python value that changes from one step to the next and is read by the statements `graphify rewrite` would
capture: a KL, curriculum or teacher-forcing coefficient computed from the step counter, a decayed learning rate
used in a hand-written update, a host statement inside the step that reads the loop counter. Reported by the
rewrite planner at every statement where it finds one, even when another breaker already blocks the loop; and a
tensor indexed by the loop's counter (`buf[step] = x` anywhere in the step, `alphas[t]` after its first GPU work).
Not flagged: values bound before the loop and never re-bound in it (configuration, shapes while shapes are fixed),
per-step values used only outside the step, `xs[step]` building the inputs before the first GPU work, and numbers
an enclosing loop sets (`lr /= 4` once per epoch): fixed while the step's loop runs, they become host inputs of
the captured step, and the runtime keeps one graph per value (up to 16, then the step runs eagerly).

## Why it breaks capture

Capture runs the step's Python once. A host number becomes a constant baked into the kernels recorded then;
replays rerun the kernels and never read the variable again. The run trains with the coefficient of the
capture step forever, without any error.

## How to fix

Keep the value on the device and update it in place outside the step (`coef.fill_(new_value)` before each replay),
or compute it on the device from a step counter tensor. Values that only feed logging can stay on the host
after the step.

## Example

Flagged:
```python
for step, (x, y) in enumerate(loader):
    recon, kl = model(x)
    beta = min(1.0, step / 1000)
    loss = recon + beta * kl
    opt.zero_grad(); loss.backward(); opt.step()
```
Instead:
```python
beta = torch.zeros((), device="cuda")
for step, (x, y) in enumerate(loader):
    beta.fill_(min(1.0, step / 1000))  # outside the captured step
    recon, kl = model(x)
    loss = recon + beta * kl
    opt.zero_grad(); loss.backward(); opt.step()
```

## Suppress

`# graphify: ignore[GFY701]` hides the diagnostic from `check`; the rewrite still leaves the loop alone.
"""
