"""GFY009 boolean-mask-indexing."""

import libcst as cst

from graphify.analysis.calls import method_call
from graphify.analysis.checker import code_of
from graphify.rules.host_sync.host_tensors import host_batch_names, on_host
from graphify.rules.registry import rule

RULE = rule("GFY009", "boolean-mask-indexing", "dynamic-shape", "error", "indexing with a boolean mask gives a data-dependent shape", False)


_MASK_FUNCTIONS = {"isfinite", "isnan", "isinf", "logical_and", "logical_or", "logical_not", "eq", "ne", "gt", "lt", "ge", "le"}
_MASK_METHODS = _MASK_FUNCTIONS | {"bool", "byte", "logical_xor"}


def _is_boolean_mask(index: cst.BaseExpression, env) -> bool:
    if isinstance(index, cst.Comparison) or (isinstance(index, cst.UnaryOperation) and isinstance(index.operator, cst.BitInvert)):
        return env.is_tensor(index)
    if isinstance(index, cst.BinaryOperation) and isinstance(index.operator, (cst.BitAnd, cst.BitOr)):
        return env.is_tensor(index)
    if isinstance(index, cst.Call):
        m = method_call(index)
        if m is not None and m[1] in _MASK_METHODS and env.is_tensor(m[0]):
            return True  # `labels.bool()`, `mask.byte()` (a uint8 mask indexes as a boolean one), `x.ne(0)`
        qual = env.qualify(index.func) or ""
        if qual in ("numpy.where", "numpy.nonzero", "torch.where") and len(index.args) == 1:
            return True  # the indexes where a condition holds: as many as it holds for
        return qual.rsplit(".", 1)[-1] in _MASK_FUNCTIONS
    if isinstance(index, cst.Name):
        return any(_is_boolean_mask(v, env) for v in env.values_of(index.value) if not isinstance(v, cst.Name))
    return False


def _assigned_a_scalar(site) -> bool:
    """`x[mask] = 0` becomes `masked_fill_`, which keeps shapes fixed."""
    parent = site.ancestors[-1] if site.ancestors else None
    if isinstance(parent, cst.AssignTarget):
        stmt = site.ancestors[-2] if len(site.ancestors) > 1 else None
        return isinstance(stmt, cst.Assign) and not site.env.is_tensor(stmt.value)
    return False


def detect(ck):
    host_batch = host_batch_names(ck)
    for node, site in ck.nodes():
        if not isinstance(node, cst.Subscript) or (site.block is ck.region.body_block and on_host(node.value, host_batch)):
            continue  # a host batch item: GFY003
        env = site.env
        if env.is_tensor(node.value) and not _assigned_a_scalar(site):
            for el in node.slice:
                if isinstance(el.slice, cst.Index) and _is_boolean_mask(el.slice.value, env):
                    yield ck.finding(
                        RULE,
                        node,
                        site,
                        f"boolean-mask indexing `{code_of(node)}`",
                        "use `torch.where(mask, x, 0)` or `masked_fill` to keep shapes fixed",
                    )


CASES = {
    "mask-made-by-a-method": (
        """
        for x, labels in loader:
            sim = model(x) @ model(x).T
            positives = sim[labels.bool()]  # here
            loss = -positives.mean()
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        for x, labels in loader:
            sim = model(x) @ model(x).T
            positives = sim[labels.long()]
            loss = -positives.mean()
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        False,
    ),
    "indexes-where-a-condition-holds": (
        """
        for x, labels in loader:
            logits = model(x)
            indices = np.where(labels.cpu().numpy() != 0)
            loss = criterion(logits[indices], labels[indices])  # here
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        for x, labels in loader:
            logits = model(x)
            weights = np.where(labels.cpu().numpy() != 0, 1.0, 0.5)
            loss = criterion(logits, labels)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        False,
    ),
}

DOC = """\
# GFY009 boolean-mask-indexing

*Category: dynamic-shape · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

Indexing a tensor with a boolean mask, `x[mask]`, read or assigned, inside the per-iteration region of a training
or inference loop. A mask is a comparison (`y > 0`), `~t`, `a & b`, `a | b`, a call of `isfinite`, `isnan`,
`isinf`, `logical_*` or `eq`/`ne`/`gt`/`lt`/`ge`/`le`, or a name assigned one of these. Not flagged: integer index
tensors (`x[idx]` has the index's shape), slices with host integers, `torch.where(mask, a, b)`, `masked_fill`.

## Why it breaks capture

The result of `x[mask]` has one element per true entry, a number only the GPU knows. PyTorch turns the mask into
indices (as `nonzero` does), copies their count to the host and waits for it, a synchronization that is illegal
during stream capture; a graph could not replay a changing size anyway. Assigning a device tensor through a mask
reads it on the host too. Assigning a Python scalar (`x[mask] = 0`) becomes `masked_fill_` and captures fine, so
graphify does not report it.

## How to fix

Keep the full shape and apply the mask arithmetically: compute the per-element loss with `reduction="none"`,
multiply by the mask and divide by `mask.sum().clamp_min(1)`; use `torch.where(mask, x, 0)` or
`x.masked_fill(~mask, 0)` for selection. For a bounded selection, gather with indices from
`torch.nonzero_static(mask, size=k)`. Write through a mask with `x.masked_fill_(mask, v)`.

## Example

Flagged:
```python
for x, y, pad in loader:
    out = model(x)
    loss = F.mse_loss(out[~pad], y[~pad])
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
for x, y, pad in loader:
    keep = (~pad).float()
    per_elem = F.mse_loss(model(x), y, reduction="none") * keep
    loss = per_elem.sum() / keep.sum().clamp_min(1)
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY009]` to the flagged line.
"""
