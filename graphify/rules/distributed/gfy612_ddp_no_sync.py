"""GFY612 ddp-no-sync."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.calls import iter_nodes, method_call
from graphify.analysis.names import dotted
from graphify.analysis.vocabulary import SYNC_FLAG
from graphify.rules.distributed.shared import followed_calls, runs_collective, runs_ddp
from graphify.rules.registry import rule

RULE = rule("GFY612", "ddp-no-sync", "distributed", "error", "DDP `no_sync()` switches gradient sync per step on the host", False)


def _toggles_gradient_sync(node: cst.CSTNode) -> bool:
    """DDP's `model.no_sync()` (entered at once or kept for a later `with`), FSDP2's
    `model.set_requires_gradient_sync(flag)`, and `model.require_backward_grad_sync = flag`."""
    if isinstance(node, cst.Assign):
        return any(isinstance(t.target, cst.Attribute) and t.target.attr.value == SYNC_FLAG for t in node.targets)
    if not isinstance(node, cst.Call):
        return False
    m = method_call(node)
    return m is not None and ((m[1] == "no_sync" and not node.args) or (m[1] == "set_requires_gradient_sync" and len(node.args) == 1))


def _toggles_alike_every_step(node: cst.CSTNode, site, ck) -> bool:
    """Whether a DDP sync toggle runs the same way on every step: what decides it (the value assigned,
    the tests of the `if`s and conditional expressions around it) reads only names the loop does not
    change, and the counters of micro-step loops `for k in range(n)` around it, n likewise unchanged. A
    graph then records on which micro-steps DDP all-reduces, and each replay does the same; a test on
    the loop's own counter (`(i + 1) % accum`) is a per-step decision no single graph makes. FSDP2's
    toggle is not: graphify does not capture FSDP."""
    if _is_fsdp_toggle(node):
        return False
    changed = ck.counters | ck.assigned_in_loop
    fixed_counters: set[str] = set()
    controls: list[cst.CSTNode] = [node.value] if isinstance(node, cst.Assign) else []
    for a in site.ancestors:
        if isinstance(a, (cst.If, cst.IfExp, cst.While)):
            controls.append(a.test)
        elif isinstance(a, cst.For) and a is not ck.loop.node:
            bounds = _range_bounds(a.iter)
            if bounds is None or not isinstance(a.target, cst.Name):
                controls.append(a.iter)
            else:
                controls.extend(bounds)
                fixed_counters.add(a.target.value)
    for control in controls:
        for n in iter_nodes(control):  # the control itself first
            if isinstance(n, cst.Call):
                return False
            name = dotted(n) if isinstance(n, (cst.Name, cst.Attribute)) else None
            if name is None or name in fixed_counters:
                continue
            if name in changed or (site.block is not ck.region.body_block and isinstance(n, cst.Name) and n.value != "self"):
                return False  # in a function the step calls, only its micro-step counters are known unchanged
    return True


def _is_fsdp_toggle(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and method_call(node)[1] == "set_requires_gradient_sync"


def _range_bounds(expr: cst.BaseExpression) -> list[cst.BaseExpression] | None:
    if isinstance(expr, cst.Call) and dotted(expr.func) == "range" and all(a.keyword is None and not a.star for a in expr.args):
        return [a.value for a in expr.args]
    return None


def detect(ck):
    followed = followed_calls(ck)
    for node, site in ck.nodes():
        env = site.env
        if runs_collective(node, env, followed) or runs_ddp(node, env, followed):
            continue  # GFY611, GFY613
        if _toggles_gradient_sync(node) and not _toggles_alike_every_step(node, site, ck):
            yield ck.finding(
                RULE,
                node,
                site,
                f"`{code_of(node)}` toggles gradient sync per step",
                "accumulate without switching sync (graphify does not capture FSDP)"
                if _is_fsdp_toggle(node)
                else "sync on the same micro-steps of every step (`for k in range(n)` in the step), or accumulate without no_sync",
            )


CASES = {
    "no-sync-kept-and-fsdp-toggle": (
        """
        import contextlib
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % 4 == 0
            model.set_requires_gradient_sync(last)  # here
            ctx = model.no_sync() if not last else contextlib.nullcontext()  # here
            with ctx:
                criterion(model(x), y).backward()
            if last:
                opt.step(); opt.zero_grad()
        """,
        """
        for i, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            if (i + 1) % 4 == 0:
                opt.step(); opt.zero_grad()
        """,
        False,
    ),
    "sync-flag-on-the-loop-counter-or-a-changing-count": (
        """
        import contextlib
        accum = 4
        for i, batch in enumerate(loader):
            model.require_backward_grad_sync = (i + 1) % accum == 0  # here
            criterion(model(batch[0]), batch[1]).backward()
            if (i + 1) % accum == 0:
                opt.step(); opt.zero_grad()
        for i, chunks in enumerate(loader):
            for k in range(len(chunks)):
                ctx = model.no_sync() if k < len(chunks) - 1 else contextlib.nullcontext()  # here
                with ctx:
                    criterion(model(chunks[k]), chunks[k]).backward()
            opt.step(); opt.zero_grad()
        """,
        """
        import contextlib
        accum = 4
        for i, batch in enumerate(loader):
            for micro in range(accum):
                model.require_backward_grad_sync = micro == accum - 1
                criterion(model(batch[micro]), batch[micro]).backward()
            opt.step(); opt.zero_grad()
        for i, batch in enumerate(loader):
            for micro in range(0, accum):
                with model.no_sync() if micro + 1 < accum else contextlib.nullcontext():
                    criterion(model(batch[micro]), batch[micro]).backward()
            opt.step(); opt.zero_grad()
        """,
        False,
    ),
}

DOC = """\
# GFY612 ddp-no-sync

*Category: distributed · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

A switch of DDP's gradient sync in the per-iteration region of a training loop, `model.no_sync()` (entered at once or
kept for a later `with`) or `model.require_backward_grad_sync = flag`, when what decides it (the value assigned, the
tests of the `if`s and conditional expressions around it) reads the loop's counter or another name the loop changes,
or calls a function; and FSDP2's `model.set_requires_gradient_sync(flag)` always (graphify does not capture FSDP).
Not flagged: a switch decided by the counter of a micro-step loop in the step, `for micro_step in range(n)` with `n`
unchanged by the loop, which turns sync off and on at the same micro-steps of every step; switches outside the step.

## Why it breaks capture

A sync switch flips a host flag that DDP's hooks read to decide whether to launch the gradient all-reduces. A graph
records the backward passes as they ran on the capture step and replays them on every step. When the step holds a
whole accumulation cycle (its micro-steps in a loop of fixed length), the graph records the cycle with its all-reduce
on the last micro-step, and every replay is that same cycle: `graphify rewrite` captures it. When each iteration is
one micro-step and the switch follows the loop's counter, syncing on the last micro-batch of a cycle is a per-step
host decision that one replayed graph cannot make.

## How to fix

Put the micro-steps of one optimizer update in the step, `for micro_step in range(accum_steps):`, and decide the
switch from `micro_step` (see the example). Or drop the switch and let DDP all-reduce on every micro-batch: the
result is the same, at the cost of more communication; GFY501's one-graph-per-cycle rewrite and GFY613's DDP setup
then apply.

## Example

Flagged:
```python
for i, (x, y) in enumerate(loader):
    if (i + 1) % accum_steps != 0:
        with ddp_model.no_sync():
            (criterion(ddp_model(x), y) / accum_steps).backward()
    else:
        (criterion(ddp_model(x), y) / accum_steps).backward()
        opt.step(); opt.zero_grad()
```
Instead (the step holds one accumulation cycle; `graphify rewrite` captures it):
```python
for it in range(max_iters):
    for micro_step in range(accum_steps):
        ddp_model.require_backward_grad_sync = micro_step == accum_steps - 1
        x, y = next(batches)
        (criterion(ddp_model(x), y) / accum_steps).backward()
    opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY612]` to the flagged line.
"""
