"""GFY103 tensor-boolean-expression."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.rules.registry import rule

RULE = rule(
    "GFY103",
    "tensor-boolean-expression",
    "data-dependent-branch",
    "error",
    "a conditional expression, `and`/`or`/`not` or `min`/`max` over tensor values",
    False,
)


_CONDITION_PARENTS = (cst.If, cst.While, cst.Assert, cst.IfExp)


def _in_condition(site):
    return any(isinstance(a, _CONDITION_PARENTS) for a in site.ancestors)


def detect(ck):
    for node, site in ck.nodes():
        env = site.env
        if isinstance(node, cst.IfExp) and env.is_tensor(node.test):
            yield ck.finding(
                RULE,
                node,
                site,
                f"conditional expression on tensor value `{code_of(node.test)}`",
                "use `torch.where(cond, a, b)`",
            )
        elif isinstance(node, cst.BooleanOperation) and not _in_condition(site):
            if env.is_tensor(node.left) or env.is_tensor(node.right):
                yield ck.finding(
                    RULE,
                    node,
                    site,
                    f"`and`/`or` on tensor values in `{code_of(node)}`",
                    "use `torch.logical_and`/`logical_or` or `&`/`|`",
                )
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ("max", "min") and len(node.args) >= 2:
            if any(env.is_tensor(a.value) for a in node.args):
                yield ck.finding(
                    RULE,
                    node,
                    site,
                    f"Python `{node.func.value}()` compares tensor values in `{code_of(node)}`",
                    f"use `torch.{node.func.value}imum(a, b)`",
                )


DOC = """\
# GFY103 tensor-boolean-expression

*Category: data-dependent-branch · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

Python expressions that decide on a tensor's value, inside the per-iteration region of a training or inference
loop: a conditional expression `a if cond else b` with a tensor `cond`, `and`/`or` with a tensor operand, and the
builtins `min(a, b, ...)`/`max(a, b, ...)` with a tensor argument. Not flagged: `&`, `|`, `~`, `torch.minimum`,
`torch.maximum`, `torch.clamp`, `torch.where`, and the same forms over host values. Not detected yet: a lone
`not t`, and `and`/`or` anywhere within an `if`, `while` or `assert` (a tensor test there is GFY101 or GFY102).

## Why it breaks capture

`and`, `or`, `not` and the conditional expression call `bool()` on the tensor; builtin `min`/`max` compare with `<`
or `>` and then call `bool()` on the result. Each call copies a value to the host and waits for the GPU, a
synchronization that is illegal during stream capture. The choice is also made by Python: a graph replays the
operands chosen at capture, whatever later steps' values are.

## How to fix

Use the element-wise tensor forms, which stay on the device and have fixed shapes: `torch.where(c, a, b)` for the
conditional expression, `&`/`|`/`~` (or `torch.logical_and`/`logical_or`/`logical_not`) for boolean logic,
`torch.minimum`, `torch.maximum` or `torch.clamp` for `min`/`max`.

## Example

Flagged:
```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss = min(loss, max_loss)
    weight = 0.5 if loss > 1.0 else 1.0
    (weight * loss).backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
for x, y in loader:
    loss = criterion(model(x), y).clamp(max=max_loss)
    weight = torch.where(loss > 1.0, 0.5, 1.0)
    (weight * loss).backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY103]` to the flagged line.
"""
