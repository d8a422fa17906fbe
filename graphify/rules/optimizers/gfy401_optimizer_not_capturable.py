"""GFY401 optimizer-not-capturable."""

from graphify.model import Applicability, Fix, FixKind
from graphify.rules.optimizers.shared import adam_without_capturable, optimizer_builds
from graphify.rules.registry import rule

RULE = rule(
    "GFY401",
    "optimizer-not-capturable",
    "non-capturable-optimizer",
    "error",
    "Adam, AdamW, RMSprop and other optimizers with a `capturable` flag, built without `capturable=True`",
    True,
    Fix(FixKind.IN_PLACE, Applicability.SAFE),
)


def detect(ck):
    for index, (name, call, module) in enumerate(optimizer_builds(ck)):
        if adam_without_capturable(name, call):
            yield ck.finding_at(
                RULE,
                call,
                module,
                f"`{name}` built without `capturable=True`",
                f"pass `capturable=True` to `{name}` (graphify rewrite sets it on the param groups before warmup)",
                order=(0, index),
            )


CASES = {
    "any-branch-of-a-choice": (
        """
        def build(kind, params):
            if kind == "adamw":
                optimizer = torch.optim.AdamW(params)  # here
            elif kind == "sgd":
                optimizer = torch.optim.SGD(params, lr=0.1)
            return optimizer
        optimizer = build("adamw", model.parameters())
        scaled = torch.optim.Adam(model.parameters()) if len(os.environ) else None  # here
        optimizer_cls = torch.optim.Adam
        head_optimizer = optimizer_cls(model.parameters())  # here
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step(); scaled.step(); head_optimizer.step()
        """,
        """
        def build(kind, params):
            if kind == "adamw":
                optimizer = torch.optim.AdamW(params, capturable=True)
            elif kind == "sgd":
                optimizer = torch.optim.SGD(params, lr=0.1)
            return optimizer
        optimizer = build("adamw", model.parameters())
        scaled = torch.optim.Adam(model.parameters(), capturable=True) if len(os.environ) else None
        optimizer_cls = torch.optim.SGD
        head_optimizer = optimizer_cls(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step(); scaled.step(); head_optimizer.step()
        """,
        True,
    ),
}

DOC = """\
# GFY401 optimizer-not-capturable

*Category: non-capturable-optimizer · Severity: error · Removed by `graphify rewrite`: yes*

## What it flags

The constructor of an optimizer that has a `capturable` option (`Adam`, `AdamW`, `Adamax`, `NAdam`, `RAdam`, `ASGD`,
`Adadelta`, `RMSprop`, `Rprop`) without a `capturable=` argument or with `capturable=False`, when an analysed
training loop steps it. Not flagged: any other `capturable=` expression (your decision); `SGD`, which keeps no step
count. `fused=True` does not exempt an optimizer: PyTorch's capture check still requires `capturable=True` (a
fused AdamW without it fails capture).

## Why it breaks capture

With `capturable=False` each parameter's step count is a CPU tensor: `step()` increments it on the host and turns it
into Python floats (the bias corrections `1 - beta ** step`) that are passed to the update kernels. A graph records
neither the increment nor the new floats, so every replay would apply the capture step's bias correction. PyTorch
refuses rather than train wrongly: `step()` raises during capture (`Attempting CUDA graph capture of step() for an
instance of AdamW but param_groups' capturable is False`). With `capturable=True` the step counts live on the device
and the bias corrections are computed by kernels, so each replay advances them.

## How to fix

Pass `capturable=True`. `graphify rewrite` turns it on in the optimizer's param groups before the warmup steps and
moves existing step counts to the device. The optimizer state must exist before capture, which the eager warmup
steps take care of. `capturable=True` adds a few kernel launches to uncaptured steps, and PyTorch warns once when
such an optimizer steps outside a capture (the warmup, a partial last batch).

## Example

Flagged:
```python
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, capturable=True)
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY401]` to the flagged line.
"""
