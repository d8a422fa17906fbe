"""GFY303 host-array-index."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.names import dotted
from graphify.rules.registry import rule

RULE = rule(
    "GFY303",
    "host-array-index",
    "cross-device",
    "error",
    "a tensor indexed with a numpy array or a list of numbers: the index is copied to the device every step",
    False,
)


def _host_array(expr, env, depth=0) -> bool:
    """A numpy array or a Python list of host numbers: made by a `numpy` call, a list literal or
    comprehension of host values, a slice of one, or a name bound only to those (or to None, tested apart)."""
    if depth > 3:
        return False
    if isinstance(expr, cst.Call):
        qual = env.qualify(expr.func) or ""
        return qual.startswith("numpy.") and not qual.startswith("numpy.random.seed")
    if isinstance(expr, cst.List):
        return bool(expr.elements) and all(env.is_host(e.value) for e in expr.elements)
    if isinstance(expr, cst.ListComp):
        return env.is_host(expr.elt)
    if isinstance(expr, cst.Subscript):
        return _host_array(expr.value, env, depth + 1)
    if isinstance(expr, cst.IfExp):
        return _all_host_arrays([expr.body, expr.orelse], env, depth)
    name = dotted(expr) if isinstance(expr, cst.Name) else None
    return _all_host_arrays(env.values_of(name), env, depth) if name else False


def _all_host_arrays(values, env, depth) -> bool:
    values = [v for v in values if not (isinstance(v, cst.Name) and v.value == "None")]
    return bool(values) and all(_host_array(v, env, depth + 1) for v in values)


def _host_array_index(node, env) -> bool:
    """`tensor[indices]` (or `tensor[:, indices]`) with host indices: torch turns them into a host index
    tensor and copies it."""
    return any(isinstance(el.slice, cst.Index) and _host_array(el.slice.value, env) for el in node.slice) and env.is_tensor(node.value)


def detect(ck):
    for node, site in ck.nodes():
        if isinstance(node, cst.Subscript) and _host_array_index(node, site.env):
            yield ck.finding(
                RULE,
                node,
                site,
                f"`{code_of(node)}` indexes a tensor with host indices, copied to the device every step",
                "make the indices a device tensor (`torch.randperm(n, device=device)`, or copy them into a static device buffer)",
                order=(0, ck.position(node)),
            )


CASES = {
    "list-of-labels": (
        """
        valid_labels = [int(line) for line in open("labels.txt")] if os.path.exists("labels.txt") else None
        with torch.no_grad():
            for x, y in loader:
                output = model(x)
                if valid_labels is not None:
                    output = output[:, valid_labels]  # here
                loss = criterion(output, y)
        """,
        """
        valid_labels = torch.tensor([int(line) for line in open("labels.txt")], device="cuda")
        with torch.no_grad():
            for x, y in loader:
                output = model(x)
                output = output[:, valid_labels]
                first = output[:, [k for k in range(2)]]
                loss = criterion(output, y)
        """,
        False,
    ),
}

DOC = """\
# GFY303 host-array-index

*Category: cross-device · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

A tensor of the step indexed with a numpy array or a Python list of numbers: a name bound to a `numpy` call
(`np.arange`, `np.random.permutation`), to a list literal or comprehension of host values
(`valid_labels = [int(l) for l in f]`, or None, tested apart), a slice of one (`inds[start:end]`), or the value
itself, in any position of the subscript (`buffer[idx]`, `logits[:, idx]`). Not flagged: indices that are tensors,
integers and slices.

## Why it breaks capture

Torch turns the array into a host index tensor and copies it to the device before the gather. Capture
records the copy from the address the array had at capture, so every replay gathers the rows of the
capture step (or reads freed memory); the per-step minibatch never changes.

## How to fix

Keep the indices on the device: draw them with `torch.randperm(n, device=device)` and slice that tensor,
or copy each step's indices into a static device buffer before the replay.

## Example

Flagged:
```python
import numpy as np
obs, targets = torch.randn(1024, 4).cuda(), torch.randint(0, 2, (1024,)).cuda()
inds = np.arange(len(obs))
for start in range(0, len(obs), 64):
    mb = inds[start:start + 64]
    loss = criterion(model(obs[mb]), targets[mb])
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
obs, targets = torch.randn(1024, 4).cuda(), torch.randint(0, 2, (1024,)).cuda()
inds = torch.arange(len(obs), device=obs.device)
for start in range(0, len(obs), 64):
    mb = inds[start:start + 64]
    loss = criterion(model(obs[mb]), targets[mb])
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY303]` to the flagged line.
"""
