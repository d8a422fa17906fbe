"""GFY502 periodic-gpu-work."""

from graphify.analysis.checker import code_of
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.host_branch.shared import accumulation, host_if, periodic_work
from graphify.rules.registry import rule

RULE = rule(
    "GFY502",
    "periodic-gpu-work",
    "host-branch",
    "warning",
    "evaluation or other GPU work under a step-counter condition",
    True,
    Fix(FixKind.EAGER, Applicability.SAFE),
)


def detect(ck):
    for node, site in ck.nodes():
        if host_if(node, site) and accumulation(node, site, ck) is None and periodic_work(node, site, ck):  # else GFY501
            yield ck.finding(
                RULE,
                node,
                site,
                f"GPU work under host condition `{code_of(node.test)}`",
                "run this block eagerly between replays (graphify rewrite keeps it outside the graph)",
            )


CASES = {
    "sync-gradients": (
        """
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = criterion(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:  # here
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                opt.step(); opt.zero_grad()
        """,
        """
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = criterion(model(x), y)
                accelerator.backward(loss)
                opt.step(); opt.zero_grad()
            if accelerator.sync_gradients:
                print("cycle done")
        """,
        True,
    ),
    "target-network-copy": (
        """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            if step % 100 == 0:  # here
                for p, tp in zip(model.parameters(), target.parameters()):
                    tp.data.copy_(p.data)
        """,
        """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            if args.sync_target:
                for p, tp in zip(model.parameters(), target.parameters()):
                    tp.data.copy_(p.data)
        """,
        True,
    ),
    "warmup-else-branch": (
        """
        for step in range(1000):
            if step < 100:  # here
                action = random.random()
            else:
                action = model(obs)
            loss = criterion(model(obs), target)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        for step in range(1000):
            if args.random_actions:
                action = random.random()
            else:
                action = model(obs)
            loss = criterion(model(obs), target)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        True,
    ),
}

DOC = """\
# GFY502 periodic-gpu-work

*Category: host-branch · Severity: warning · Removed by `graphify rewrite`: yes*

## What it flags

An `if` on a host value (typically `step % N == 0`) inside the per-iteration region of a training loop whose body
evaluates or samples: it enters `torch.no_grad()`/`inference_mode()`, calls `model.eval()`, or calls a function
named `eval*`, `valid*`, `test*`, `estimate*`, `sample*` or `generate*`; and any work but logging under accelerate's
`if accelerator.sync_gradients:` (true on the last micro-step of an accumulation cycle); and any GPU work (an in-place
copy into `p.data`, a model call, also in the `else` branch) under a test on the loop's counter. Not flagged: an optimizer step or
`zero_grad` under the condition (GFY501), logging and file writes (GFY511, GFY512), per-epoch work in an epoch loop.

## Why it breaks capture

A graph replays what ran on the capture step. If the condition was false then, the periodic work is missing from
every replay and evaluation silently stops; if it was true, the work runs on every replay. The test itself, and the
host state that evaluation toggles (`model.eval()`/`model.train()`, grad mode), are not replayed. Capture usually
succeeds, which is why this is a warning rather than an error.

## How to fix

Keep periodic work out of the graph and run it eagerly between replays. The graph updates the parameters, buffers
and optimizer state in place, so eager code after a replay sees the current weights. `graphify rewrite` moves the
guarded block after `g.replay()`. In that block, do not replace parameter tensors (new `nn.Parameter`s,
`model.to(...)`): the graph would keep updating the old ones.

## Example

Flagged:
```python
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 500 == 0:
        val_loss = evaluate(model, val_loader)
```
Instead (captured by hand):
```python
for step, (x, y) in enumerate(loader):
    static_x.copy_(x); static_y.copy_(y)
    g.replay()
    if step % 500 == 0:
        val_loss = evaluate(model, val_loader)   # eager, on the weights the graph updates in place
```

## Suppress

Add `# graphify: ignore[GFY502]` to the flagged line.
"""
