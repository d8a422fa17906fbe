"""GFY421 grad-scaler-step."""

from graphify.analysis.checker import code_of
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.amp.shared import scaler_method
from graphify.rules.registry import rule

RULE = rule(
    "GFY421",
    "grad-scaler-step",
    "amp-grad-scaler",
    "error",
    "`GradScaler.step` reads `found_inf` on the host; `update` must run where `step` runs",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def detect(ck):
    for node, site in ck.nodes():
        method = scaler_method(node, site.env)
        if method is not None:
            what = (
                "records the optimizer as unscaled in the scaler's host state" if method == "unscale_" else "reads `found_inf` on the host"
            )
            yield ck.finding(
                RULE,
                node,
                site,
                f"`{code_of(node)}` {what}",
                "capture forward and scaled backward; run `scaler.step`/`scaler.update` eagerly after the replay",
            )


CASES = {
    "unscale": (
        """
        scaler = torch.amp.GradScaler()
        for x, y in loader:
            scaler.scale(criterion(model(x), y)).backward()
            scaler.unscale_(opt)  # here
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        """,
        """
        scaler = torch.amp.GradScaler()
        for x, y in loader:
            scaler.scale(criterion(model(x), y)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.unscale_(opt)
        """,
        True,
    ),
}

DOC = """\
# GFY421 grad-scaler-step

*Category: amp-grad-scaler · Severity: error · Removed by `graphify rewrite`: yes*

## What it flags

`scaler.unscale_(opt)`, `scaler.step(opt)` and `scaler.update()` on a `torch.amp.GradScaler` (or `torch.cuda.amp.GradScaler`) inside the
per-iteration region of a training loop (`unscale_` marks the optimizer unscaled in the scaler's host state, which
`step` reads and `update` resets). Not flagged: `scaler.scale(loss).backward()`, which multiplies by the scale
tensor on the device and belongs in the graph.

## Why it breaks capture

`scaler.step(opt)` unscales the gradients and records per device, in a `found_inf` tensor, whether any is inf or
NaN; for ordinary optimizers it then reads those flags on the host (`found_inf.item()`) to decide whether to call
`opt.step()` at all. That read is a sync, illegal during capture, and the skip is a host branch that a graph, fixed
at capture, could not take on later steps. `update()` consumes the flags `step` left in the scaler's host-side state
and resets that state, so it must run wherever `step` runs. With `fused=True` optimizers the skip moves to the
device, but the scaler's per-step bookkeeping stays on the host, where a replay does not repeat it.

## How to fix

Follow PyTorch's AMP recipe: capture the autocast forward, the loss and `scaler.scale(loss).backward()`; after each
replay call `scaler.step(opt)` and `scaler.update()` eagerly. The optimizer step is then not captured. If you unscale
and clip before the step, do that after the replay too. Do not zero the gradients with `set_to_none=True` between
replays: the graph writes its static `.grad` tensors in place. `graphify rewrite` captures the step up to the first
`scaler.unscale_`/`step`/`update` call and runs that call and everything after it eagerly after the replay.

## Example

Flagged:
```python
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad()
```
Instead (captured by hand):
```python
for x, y in loader:
    static_x.copy_(x); static_y.copy_(y)
    g.replay()          # autocast forward, loss, scaler.scale(loss).backward()
    scaler.step(opt)    # graphify: ignore[GFY421] -- eager, after the replay
    scaler.update()     # graphify: ignore[GFY421]
```

## Suppress

Add `# graphify: ignore[GFY421]` to the flagged line.
"""
