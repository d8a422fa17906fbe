"""GFY601 rng-state-in-step."""

from graphify.analysis.checker import code_of
from graphify.rules.registry import rule
from graphify.rules.rng.shared import torch_call, touches_state

RULE = rule("GFY601", "rng-state-in-step", "rng", "error", "seeding, or reading/setting RNG state inside the step, is not replayed", False)


def detect(ck):
    for call, site in ck.calls():
        last = torch_call(call, site)
        if last is not None and touches_state(last):
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` touches RNG state inside the step",
                "seed once before the loop; for per-step generators register them with `graph.register_generator_state`",
            )


DOC = """\
# GFY601 rng-state-in-step

*Category: rng · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

Seeding, saving or restoring random-number state inside the per-iteration region of a training or inference loop:
`torch.manual_seed`, `torch.seed`, `torch.cuda.manual_seed(_all)`, `torch.cuda.seed(_all)`, `get_rng_state`/
`set_rng_state` (and `_all`) of `torch` and `torch.cuda`, `torch.random.fork_rng`, and creating a
`torch.Generator`. Not flagged: all of these in setup code, `graphsafe_get_state`/`graphsafe_set_state`, and random
ops themselves (GFY602 covers custom generators).

## Why it breaks capture

The default CUDA generator takes part in capture: random kernels read their Philox seed and offset from device memory
the graph owns, and PyTorch advances the offset on every replay, so each replay draws new numbers. Host-side changes
to that state do not fit: reseeding the CUDA generator with a new seed while capturing raises, and saving or
restoring the state is host work that runs once, at capture, and never before a replay. Per-step reseeding and
save/restore around a block silently stop working; PyTorch's notes point graph code to the `graphsafe_*` methods.

## How to fix

Seed once, before warmup and capture, and drop per-step reseeding: a replayed run is reproducible from that one
seed. If a block must reuse the same random numbers, save and restore the state between replays with
`graphsafe_get_state()` / `graphsafe_set_state()` on a generator registered with the graph.

## Example

Flagged:
```python
for step, (x, y) in enumerate(loader):
    torch.manual_seed(base_seed + step)
    loss = criterion(model(x), y)          # the model uses dropout
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
torch.manual_seed(base_seed)               # once, before warmup and capture
for x, y in loader:
    loss = criterion(model(x), y)          # every replay draws fresh dropout masks
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY601]` to the flagged line.
"""
