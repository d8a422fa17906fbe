"""GFY422 autocast-cache."""

import libcst as cst

from graphify.analysis.checker import code_of, kwarg
from graphify.analysis.names import dotted
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.registry import rule

RULE = rule(
    "GFY422",
    "autocast-cache",
    "amp-grad-scaler",
    "warning",
    "`autocast` inside a captured step needs `cache_enabled=False`",
    True,
    Fix(FixKind.IN_PLACE, Applicability.SAFE),
)


def _autocast_call(expr, env, depth=0):
    if depth > 4:
        return None
    if isinstance(expr, cst.Call):
        return expr if (env.qualify(expr.func) or "").endswith("autocast") else None
    if isinstance(expr, cst.IfExp):
        return _autocast_call(expr.body, env, depth + 1) or _autocast_call(expr.orelse, env, depth + 1)
    name = dotted(expr)
    for value in env.values_of(name) if name else ():
        found = _autocast_call(value, env, depth + 1)
        if found is not None:
            return found
    return None


def detect(ck):
    for node, site in ck.nodes():
        if isinstance(node, cst.WithItem):
            call = _autocast_call(node.item, site.env)
            if call is not None:
                cache = kwarg(call, "cache_enabled")
                if not (isinstance(cache, cst.Name) and cache.value == "False"):
                    yield ck.finding(
                        RULE,
                        node,
                        site,
                        f"`{code_of(node.item)}` caches casts across the captured region",
                        "pass `cache_enabled=False` to autocast inside a captured step",
                    )


CASES = {
    "closure-from-factory": (
        """
        def make_step(model, opt):
            def step(x, y):
                with torch.autocast("cuda"):  # here
                    loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
            return step
        step = make_step(model, opt)
        for x, y in loader:
            step(x, y)
        """,
        """
        def make_step(model, opt):
            def step(x, y):
                with torch.autocast("cuda", cache_enabled=False):
                    loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
            return step
        step = make_step(model, opt)
        for x, y in loader:
            step(x, y)
        """,
        True,
    ),
}

DOC = """\
# GFY422 autocast-cache

*Category: amp-grad-scaler · Severity: warning · Removed by `graphify rewrite`: yes*

## What it flags

`torch.autocast(...)`, `torch.amp.autocast(...)` or `torch.cuda.amp.autocast(...)` entered inside the per-iteration
region of a training or inference loop without `cache_enabled=False`. Not flagged: `cache_enabled=False`, and
autocast regions outside analysed loops.

## Why it breaks capture

With caching on, autocast keeps the lower-precision copy of each float32 leaf tensor that requires grad (the
weights) after its first cast, and reuses it until the outermost autocast context exits. Under capture those copies
come from the graph's private memory pool and are released at the context's exit, and a copy cast before capture
began (in warmup, or by an autocast region that encloses the capture) would be read by the graph at its old address:
a stale cast of weights the optimizer has since updated. `make_graphed_callables` refuses cached autocast outright.
With the cache off, every forward re-casts the weights with ordinary kernels that each replay repeats after the
optimizer update. It is a warning because a region wholly inside the capture usually replays correctly.

## How to fix

Pass `cache_enabled=False`; `graphify rewrite` adds it. The cost is small: a weight used several times in one forward
(tied embeddings, an RNN cell applied per time step) is cast once per use rather than once per forward.

## Example

Flagged:
```python
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY422]` to the flagged line.
"""
