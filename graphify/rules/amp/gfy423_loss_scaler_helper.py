"""GFY423 loss-scaler-helper."""

import libcst as cst

from graphify.analysis.calls import is_delegated_step
from graphify.analysis.checker import code_of
from graphify.analysis.vocabulary import SCALER
from graphify.rules.amp.shared import scaler_method
from graphify.rules.registry import rule

RULE = rule(
    "GFY423",
    "loss-scaler-helper",
    "amp-grad-scaler",
    "error",
    "a loss-scaler object called with the loss and the optimizer runs backward and `GradScaler.step` out of sight",
    False,
)


def detect(ck):
    for node, site in ck.nodes():
        env = site.env
        if (
            isinstance(node, cst.Call)
            and is_delegated_step(node, env)
            and env.kind_of(node.func) == SCALER
            and scaler_method(node, env) is None
        ):
            yield ck.finding(
                RULE,
                node,
                site,
                f"`{code_of(node.func)}(...)` runs backward, `GradScaler.step` and `update` inside itself",
                "call `scaler.scale(loss).backward()`, `scaler.step(optimizer)` and `scaler.update()` in the loop",
            )


CASES = {
    "loss-scaler-on-unknown-loss": (
        """
        loss_scaler = timm.utils.NativeScaler()
        for x, y in loader:
            result = task(x, y)
            loss_scaler(result["loss"], opt, clip_grad=1.0)  # here
        """,
        """
        for x, y in loader:
            result = task(x, y)
            scaled = loss_scaler(result["loss"])
            scaled.backward(); opt.step(); opt.zero_grad()
        """,
        False,
    ),
}

DOC = """\
# GFY423 loss-scaler-helper

*Category: amp-grad-scaler · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

A call of a loss-scaler object with the loss and the optimizer, inside the per-iteration region of a training
loop: `loss_scaler(loss, optimizer, clip_grad=..., parameters=model.parameters())`, as timm's `NativeScaler`
and the scripts built on it (DeiT, MAE, ConvNeXt) do. The object is recognised by its name or construction
(`...scaler`); its code lives in another package, so the backward and the optimizer step happen out of sight.

## Why it breaks capture

Such helpers run `scaler.scale(loss).backward()`, optionally unscale and clip, then `GradScaler.step` and
`update`. `step` reads `found_inf` on the host to decide whether to skip the optimizer step (GFY421), and
clipping often returns a norm the caller logs. None of it can be split around a replay without seeing it.

## How to fix

Write the three calls in the loop, so the forward and scaled backward can be captured and the scaler's step
and update run eagerly after each replay (GFY421 explains the split). With bfloat16 autocast no scaler is
needed at all: call `loss.backward()` and `optimizer.step()`.

## Example

Flagged:
```python
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
        loss = criterion(model(x), y)
    loss_scaler(loss, opt, parameters=model.parameters())
    opt.zero_grad()
```
Instead:
```python
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY423]` to the flagged line; the rewrite still leaves the loop alone.
"""
