"""GFY602 custom-generator-in-step."""

from graphify.analysis.checker import code_of, kwarg
from graphify.rules.registry import rule
from graphify.rules.rng.shared import torch_call, touches_state

RULE = rule(
    "GFY602",
    "custom-generator-in-step",
    "rng",
    "error",
    "random ops on a custom `torch.Generator` need it registered with the graph",
    False,
)


def detect(ck):
    for call, site in ck.calls():
        last = torch_call(call, site)
        if last is not None and not touches_state(last) and kwarg(call, "generator") is not None:
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` draws from a custom generator",
                "use the default CUDA generator, or register the generator with `graph.register_generator_state(gen)` before capture",
            )


DOC = """\
# GFY602 custom-generator-in-step

*Category: rng · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

Calls of `torch.*` random functions with a `generator=` argument (`torch.randn`, `rand`, `randint`, `randperm`,
`bernoulli`, `multinomial`, `normal`, ...) inside the per-iteration region of a training or inference loop. Not
flagged: random ops on the default generator (`torch.randn(..., device="cuda")`, `nn.Dropout`, `F.dropout`), tensor
methods such as `x.normal_(generator=g)`, and generators used in setup code.

## Why it breaks capture

During capture each random kernel takes its Philox seed and offset from its generator in a form the graph can
advance. The default CUDA generator is set up for this automatically; any other generator must be registered with the
graph before capture. An unregistered CUDA generator raises `Attempt to increase offset for a CUDA generator not in
capture mode`; a registered one has its offset advanced on every replay, so each replay draws new numbers. A CPU
generator makes host tensors, host work that a replay does not repeat (see GFY302).

## How to fix

Create the graph first and register each custom CUDA generator before capturing:
`g = torch.cuda.CUDAGraph(); g.register_generator_state(gen)`, then `with torch.cuda.graph(g): ...`. Or use the
default generator when a separate random stream is not needed. `graphify rewrite` does not register generators.

## Example

Flagged:
```python
gen = torch.Generator(device="cuda").manual_seed(1234)
for x, y in loader:
    noise = torch.randn(x.shape, generator=gen, device="cuda")
    loss = criterion(model(x + 0.1 * noise), y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead (captured by hand):
```python
g = torch.cuda.CUDAGraph()
g.register_generator_state(gen)            # before capture
with torch.cuda.graph(g):
    noise = torch.randn(static_x.shape, generator=gen, device="cuda")
    static_loss = criterion(model(static_x + 0.1 * noise), static_y)
    static_loss.backward(); opt.step()
```

## Suppress

Add `# graphify: ignore[GFY602]` to the flagged line.
"""
