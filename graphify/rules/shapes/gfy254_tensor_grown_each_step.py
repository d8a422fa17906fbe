"""GFY254 tensor-grown-each-step."""

import libcst as cst

from graphify.analysis.calls import is_model_call
from graphify.analysis.checker import code_of
from graphify.analysis.statements import names_read, names_written, walk
from graphify.model import Fix, Partial
from graphify.rules.registry import rule

RULE = rule(
    "GFY254",
    "tensor-grown-each-step",
    "dynamic-shape",
    "error",
    "a tensor the loop lengthens every iteration (`x = torch.cat((x, y))`) and the model reads gives each step a new shape",
    False,
    Fix(partial=Partial.NEVER),
)

_KEEP_LENGTH = {"detach", "to", "contiguous", "clone", "float", "long", "int", "half", "cuda"}
_JOINS = {"cat", "concat", "concatenate", "hstack", "vstack", "column_stack", "row_stack", "dstack"}


def _grown_name(stmt: cst.CSTNode, aliases) -> tuple[str, cst.Call] | None:
    """`x = torch.cat((x, y), dim=1)`: the name a statement binds to a join of itself with something else."""
    line = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    if not isinstance(line, cst.Assign) or len(line.targets) != 1 or not isinstance(line.targets[0].target, cst.Name):
        return None
    call, name = line.value, line.targets[0].target.value
    while isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value in _KEEP_LENGTH:
        call = call.func.value  # `torch.cat((h, t), dim=1).detach()`
    if not isinstance(call, cst.Call) or not call.args:
        return None
    qual = aliases.qualify(call.func) or ""
    if not (qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in _JOINS):
        return None
    parts = call.args[0].value
    if not isinstance(parts, (cst.Tuple, cst.List)):
        return None
    # itself, or its rows picked again (`history[beam_idx]`, a beam search keeping its best sequences)
    if len(parts.elements) > 1 and any(isinstance(n, cst.Name) and n.value == name for e in parts.elements for n in walk(e.value)):
        return name, call
    return None


def _read_by_a_model(ck, name: str) -> bool:
    """Whether a model call of the iteration reads the name, or a name the loop body binds from it
    (`idx_cond = idx[:, -context:]`)."""
    body = ck.loop.node.body.body if isinstance(ck.loop.node.body, cst.IndentedBlock) else []
    derived = {name}
    for stmt in body:
        if names_read(stmt) & derived:
            derived |= names_written(stmt) - {name}
    for node, site in ck.nodes():
        if isinstance(node, cst.Call) and is_model_call(node, site.env):
            if any(isinstance(n, cst.Name) and n.value in derived for a in node.args for n in walk(a.value)):
                return True
    return False


def detect(ck):
    body = ck.loop.node.body.body if isinstance(ck.loop.node.body, cst.IndentedBlock) else []
    for index, stmt in enumerate(body):
        grown = _grown_name(stmt, ck.loop.module.aliases)
        if grown is None:
            continue
        name, call = grown
        if any(name in names_written(s) for s in body[:index]):
            continue  # bound afresh earlier in the iteration: it grows within the step, not from step to step
        if _read_by_a_model(ck, name):
            yield ck.finding_at(
                RULE,
                call,
                ck.loop.module,
                f"`{code_of(call)}` lengthens `{name}` every iteration, and the model reads it: each step has a new shape, "
                "so a graph would be captured for every step and none replayed",
                "leave this loop eager, or write into a preallocated tensor of the full length and pass a fixed-size window",
                order=(1, index, 0),
            )


CASES = {
    "generation-appending-a-token": (
        """
        def generate(model, idx, steps):
            with torch.no_grad():
                for _ in range(steps):
                    logits = model(idx[:, -256:])
                    idx_next = torch.argmax(logits[:, -1, :], dim=-1, keepdim=True)
                    idx = torch.cat((idx, idx_next), dim=1)  # here
            return idx
        """,
        """
        def generate(model, idx, steps):
            with torch.no_grad():
                for _ in range(steps):
                    logits = model(idx[:, -256:])
                    idx_next = torch.argmax(logits[:, -1, :], dim=-1, keepdim=True)
                    out = torch.cat((idx, idx_next), dim=1)
            return out
        """,
        False,
    ),
}

DOC = """\
# GFY254 tensor-grown-each-step

*Category: dynamic-shape · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

A tensor the loop lengthens every iteration by joining it with something else (`idx = torch.cat((idx, idx_next),
dim=1)`, `torch.concat`, `torch.hstack`, ...), which a model call of the iteration reads, directly or through a name
the loop body binds from it (`idx_cond = idx[:, -context:]`). Typical of autoregressive generation and of
rollouts that keep a growing history. Not flagged: a join bound to another name, or a name bound afresh earlier
in the same iteration.

## Why it breaks capture

A graph replays one set of shapes. A tensor that grows by a step each iteration gives the model a new shape every
step: a graph would be captured for each step and never replayed, at the cost of a capture each time. The runtime
keys graphs by their inputs' shapes, so nothing trains or infers wrong, but nothing is gained either.

## How to fix

Preallocate the tensor at its full length before the loop, write each new part into its slice, and pass the
model a fixed-size window (the last `context` positions) so its input keeps one shape; or leave the loop eager.

## Example

Flagged:
```python
with torch.no_grad():
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context:])
        idx_next = logits[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat((idx, idx_next), dim=1)
```
Instead (a window of fixed size once the buffer holds `context` tokens):
```python
buf = torch.zeros(batch, context + max_new_tokens, dtype=torch.long, device=device)
buf[:, :context] = idx[:, -context:]
with torch.no_grad():
    for t in range(context, context + max_new_tokens):
        logits = model(buf[:, t - context:t])
        buf[:, t] = logits[:, -1].argmax(-1)
```

## Suppress

Add `# graphify: ignore[GFY254]` to the flagged line.
"""
