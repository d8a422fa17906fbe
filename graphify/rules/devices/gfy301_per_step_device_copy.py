"""GFY301 per-step-device-copy."""

import libcst as cst

from graphify.analysis.checker import code_of, is_cpu_arg, is_device_arg
from graphify.analysis.calls import iter_nodes, method_call
from graphify.analysis.vocabulary import DDP, LOSS, MODEL
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.devices.shared import device_copies, module_brought_back, offloaded, step_values
from graphify.rules.registry import rule

RULE = rule(
    "GFY301",
    "per-step-device-copy",
    "cross-device",
    "error",
    "`.to(device)`/`.cuda()` of per-step data reads a host address that replay never refreshes",
    True,
    Fix(FixKind.STATIC_INPUT, Applicability.SAFE),
)


def _per_step_batches(ck, step_values) -> set[str]:
    """Names that hold the batch of this iteration: the loop's target, or what `next(iterator)` returns."""
    names = set()
    if isinstance(ck.loop.node, cst.For):
        names.update(n.value for n in iter_nodes(ck.loop.node.target) if isinstance(n, cst.Name))
    for name, values in step_values.items():
        if any(isinstance(v, cst.Call) and isinstance(v.func, cst.Name) and v.func.value == "next" for v in values):
            names.add(name)
    return names


def _batches_handed_to_device_helpers(ck, step_values):
    """`batch = task.prepare_batch(batch, device)`, `batch_to_device(batch, self._device)`: a helper whose body
    graphify does not see is handed the step's batch and a device; it copies the batch there. The rewrite
    cannot turn that into a static-buffer copy, so the statement stays eager, before the step."""
    batches = _per_step_batches(ck, step_values)
    followed = {id(b.call) for b in ck.region.blocks if b.call is not None}
    for call, site in ck.calls():
        if site.block is not ck.region.body_block or id(call) in followed or not batches:
            continue
        env = site.env
        args = [a.value for a in call.args if not a.star]
        m = method_call(call)
        if (
            (m is not None and m[1] in ("to", "cuda", "type"))
            or not any(isinstance(a, cst.Name) and a.value in batches for a in args)
            or not any(is_device_arg(a, env) and not is_cpu_arg(a, env) for a in args)
            or (env.qualify(call.func) or "").startswith("torch.")
            or env.kind_of(call.func) in (MODEL, DDP, LOSS)
        ):
            continue
        yield ck.finding(
            RULE,
            call,
            site,
            f"`{code_of(call)}` is handed the step's batch and a device: it copies per-step data to the device",
            "copy each batch to the device before the step, or into static device buffers",
            False,
            order=(1, ck.position(call)),
        )


def detect(ck):
    yield from _batches_handed_to_device_helpers(ck, step_values(ck))
    modules = offloaded(ck)
    copies = {id(call): from_host_factory for call, _, from_host_factory in device_copies(ck)}
    for call, site in ck.calls():
        if module_brought_back(call, site.env, modules):
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` copies a module the step offloads back to the device every step",
                "keep the module on the device during training; offload it between epochs, if at all",
                False,
                order=(2, ck.position(call)),
            )
        elif id(call) in copies and not copies[id(call)]:  # from a host factory: GFY302
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` copies per-step data to the device",
                "copy each batch into a static device buffer with `static.copy_(batch, non_blocking=True)` before the replay",
                order=(2, ck.position(call)),
            )


CASES = {
    "module-brought-back": (
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            ema_model.to(device="cuda", non_blocking=True)  # here
            update_ema(ema_model, model)
            ema_model.to(device="cpu", non_blocking=True)
        """,
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            ema_model.to(device="cuda", non_blocking=True)
            update_ema(ema_model, model)
        """,
        False,
    ),
    "mapped-lambda": (
        """
        for batch in loader:
            x, y = map(lambda t: t.to(device), batch)  # here
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        for batch in loader:
            x, y = map(lambda t: t.float(), batch)
            to_device = lambda t: t.to(device)
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        True,
    ),
    "batch-handed-to-device-helper": (
        """
        it = iter(loader)
        while True:
            batch = next(it)
            batch = task.prepare_batch(batch, device=device)  # here
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        it = iter(loader)
        while True:
            batch = next(it)
            batch = task.prepare_batch(batch, device="cpu")
            batch = collate(batch, max_len)
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        False,
    ),
}

DOC = """\
# GFY301 per-step-device-copy

*Category: cross-device · Severity: error · Removed by `graphify rewrite`: yes*

## What it flags

`.cuda()` and `.to(device)` (a `"cuda"` string, a `torch.device`, a name like `device` or `local_rank`, or
`device=`) inside the per-iteration region of a training or inference loop, on any value other than a host value,
model or loss module: in practice, the batch; and a call of code graphify does not see that is handed the
iteration's batch and a device (`batch = task.prepare_batch(batch, device)`, `batch_to_device(batch, self._device)`),
which the rewrite leaves eager before the step. Not flagged: moving the model or setup tensors before the loop,
dtype-only `.to(...)`, device-to-host copies (GFY003), and moves of fresh host factories (GFY302). A module moved
back to the device in a step that also offloads it to the host (`ema.to("cuda")` ... `ema.to("cpu")`) is flagged: its
weights cross every step; the rewrite does not remove it. `map(lambda x: x.to(device), batch)` counts as in the step.

## Why it breaks capture

Capture records a host-to-device copy as a memcpy with fixed source and destination addresses. Each step's batch
sits at a new host address, but every replay copies from the address the capture step's batch had: stale or freed
memory. The model then trains on the same batch, or on garbage, with no error. Copies out of pageable memory cannot
be captured at all.

## How to fix

Use static input buffers: allocate device tensors with the batch's shape and dtype before warmup, capture a step that
reads only them, and before each replay copy the new batch in with `static_x.copy_(x, non_blocking=True)`, outside
the graph. `pin_memory=True` on the loader keeps that copy asynchronous. `graphify rewrite` keeps a device copy
that comes before the step eagerly, written `train_step.stage(x, device)` (the same copy, queued without making the
CPU wait for the replays before it), and copies its result into the graph's static input buffers before each replay.

## Example

Flagged:
```python
for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead (captured by hand):
```python
static_x = torch.empty(64, 3, 224, 224, device=device)
static_y = torch.empty(64, dtype=torch.long, device=device)
# ... warm up on a side stream, then capture the step on static_x / static_y into g ...
for x, y in loader:
    static_x.copy_(x, non_blocking=True); static_y.copy_(y, non_blocking=True)
    g.replay()
```

## Suppress

Add `# graphify: ignore[GFY301]` to the flagged line.
"""
