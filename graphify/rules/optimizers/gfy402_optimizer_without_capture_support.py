"""GFY402 optimizer-without-capture-support."""

from graphify.analysis.checker import is_true, kwarg
from graphify.analysis.vocabulary import NEVER_CAPTURABLE
from graphify.model import Fix, Partial
from graphify.rules.optimizers.shared import adam_without_capturable, optimizer_builds
from graphify.rules.registry import rule

RULE = rule(
    "GFY402",
    "optimizer-without-capture-support",
    "non-capturable-optimizer",
    "error",
    "LBFGS, SparseAdam and optimizers with host-side logic cannot be captured",
    False,
    Fix(partial=Partial.NEVER),
)


def detect(ck):
    for index, (name, call, module) in enumerate(optimizer_builds(ck)):
        if adam_without_capturable(name, call):
            continue  # GFY401
        if name in NEVER_CAPTURABLE or (name == "Adagrad" and not is_true(kwarg(call, "fused"))):
            hint = (
                "pass `fused=True` (graph-safe on CUDA)"
                if name == "Adagrad"
                else "use an optimizer that supports capture (Adam/AdamW with `capturable=True`, SGD)"
            )
            yield ck.finding_at(RULE, call, module, f"`{name}` cannot be captured in a CUDA graph", hint, order=(0, index))


DOC = """\
# GFY402 optimizer-without-capture-support

*Category: non-capturable-optimizer · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

The constructor of an optimizer without a capture-safe mode, when an analysed training loop steps it:
`torch.optim.LBFGS`, `torch.optim.SparseAdam`, and `torch.optim.Adagrad` without `fused=True`. Not flagged: the
optimizers with a `capturable` option (GFY401 covers them), `SGD`, and a fused `Adagrad`.

## Why it breaks capture

LBFGS calls the closure several times per step and runs a line search and convergence tests on host numbers
(`float(loss)`, tolerance comparisons): each test is a sync, illegal during capture, and the number of evaluations
changes from step to step, which no fixed graph can replay. SparseAdam works on sparse gradients whose number of rows
depends on the batch, so its shapes and allocations change every step. Non-fused Adagrad keeps its step count on
the host and folds it into a Python float (its `lr_decay` schedule), which capture would freeze.

## How to fix

Switch to an optimizer that captures (`SGD`, `Adam`/`AdamW` with `capturable=True`, `Adagrad(fused=True)`). For
SparseAdam, use dense embedding gradients with Adam; note that dense Adam also decays the moments of rows absent from
the batch, which SparseAdam's lazy update does not. To keep LBFGS, graph only the model
(`torch.cuda.make_graphed_callables(model, (sample_x,))` graphs forward and backward) and leave its step eager.

## Example

Flagged:
```python
emb = nn.Embedding(1_000_000, 64, sparse=True).cuda()
opt = torch.optim.SparseAdam(emb.parameters(), lr=1e-3)
for ids, y in loader:
    loss = criterion(emb(ids).sum(1), y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
emb = nn.Embedding(1_000_000, 64).cuda()                  # dense gradients
opt = torch.optim.Adam(emb.parameters(), lr=1e-3, capturable=True)
for ids, y in loader:
    loss = criterion(emb(ids).sum(1), y)
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY402]` to the flagged line.
"""
