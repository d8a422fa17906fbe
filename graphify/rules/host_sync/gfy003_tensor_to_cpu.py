"""GFY003 tensor-to-cpu."""

import libcst as cst

from graphify.analysis.calls import method_call
from graphify.analysis.checker import code_of
from graphify.analysis.names import dotted
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.host_sync.shared import READ_AFTER, method_read
from graphify.rules.host_sync.host_tensors import host_batch_names, model_output, on_host
from graphify.rules.registry import rule

RULE = rule(
    "GFY003",
    "tensor-to-cpu",
    "host-sync",
    "error",
    "`.cpu()` / `.to('cpu')` copies a tensor to the host and waits for the GPU",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def _library_metric(receiver: cst.BaseExpression, env) -> bool:
    """A Hugging Face `evaluate` metric (`evaluate.load("glue")`, `datasets.load_metric`): it converts the
    tensors it is fed to Python and NumPy data."""
    name = dotted(receiver)
    return bool(name) and any(
        isinstance(v, cst.Call) and ((env.qualify(v.func) or "").startswith("evaluate.") or env.qualify(v.func) == "datasets.load_metric")
        for v in env.values_of(name)
    )


def _copies(ck, call: cst.Call, site, host_batch: set[str]):
    read = method_read(ck, call, site, host_batch)
    if read == "module_to_cpu":
        yield ck.finding(
            RULE,
            call,
            site,
            f"`{code_of(call)}` copies the module's weights to the host every step",
            "keep the module on the device during training; offload it between epochs, if at all",
            False,
        )
    elif read == "to_cpu":
        yield ck.finding(RULE, call, site, f"`{code_of(call)}` copies to the host", READ_AFTER, ck.host_read_removable(call, site))
    m = method_call(call)
    if m is not None and m[1] in ("add_batch", "add", "compute") and _library_metric(m[0], site.env):
        fed = [a.value for a in call.args if site.env.is_tensor(a.value)]
        if fed:
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(m[0])}.{m[1]}(...)` converts `{code_of(fed[0])}` to host data",
                "feed the metric after the step (graphify rewrite reads the graph's static output after each replay)",
                ck.host_read_removable(call, site),
            )


def detect(ck):
    host_batch = host_batch_names(ck)
    for node, site in ck.nodes():
        if isinstance(node, cst.Call):
            yield from _copies(ck, node, site, host_batch)
        elif isinstance(node, cst.Subscript) and site.block is ck.region.body_block and on_host(node.value, host_batch):
            device_index = [
                el.slice.value for el in node.slice if isinstance(el.slice, cst.Index) and model_output(el.slice.value, ck, site.env)
            ]
            if device_index:
                yield ck.finding(
                    RULE,
                    node,
                    site,
                    f"`{code_of(node)}` indexes a host tensor with device tensor `{code_of(device_index[0])}`, copied to the host",
                    "move the host tensor to the device before the step, or index it after the step",
                    ck.host_read_removable(node, site),
                )


CASES = {
    "evaluate-metric": (
        """
        import evaluate
        metric = evaluate.load("accuracy")
        with torch.no_grad():
            for x, y in loader:
                predictions = model(x).argmax(dim=-1)
                metric.add_batch(predictions=predictions, references=y)  # here
        """,
        """
        import evaluate
        metric = evaluate.load("accuracy")
        correct = []
        with torch.no_grad():
            for x, y in loader:
                predictions = model(x).argmax(dim=-1)
                correct.append(predictions == y)
        metric.add_batch(predictions=predictions, references=y)
        """,
        True,
    ),
    "module-offloaded": (
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            ema_model.to("cuda", non_blocking=True)
            update_ema(ema_model, model)
            ema_model.to("cpu", non_blocking=True)  # here
        """,
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            update_ema(ema_model, model)
        ema_model.to("cpu")
        """,
        False,
    ),
    "host-batch-indexed-on-device": (
        """
        loader = torch.utils.data.DataLoader(dataset, batch_size=8)
        with torch.no_grad():
            for imgs, caps in loader:
                out, order = model(imgs.to(device))
                caps = caps[order]  # here
        """,
        """
        loader = torch.utils.data.DataLoader(dataset, batch_size=8)
        with torch.no_grad():
            for imgs, caps in loader:
                caps = caps.to(device)
                out, order = model(imgs.to(device))
                caps = caps[order]
        """,
        True,
    ),
    "module-put-in-eval-mode": (
        """
        def evaluate(task, loader):
            task.eval()
            feats = []
            with torch.no_grad():
                for batch in loader:
                    out = task(batch)
                    feats.append(out.cpu())  # here
        """,
        """
        def evaluate(task, loader):
            feats = []
            with torch.no_grad():
                for batch in loader:
                    out = task(batch)
                    feats.append(out.cpu())
        """,
        True,
    ),
}

DOC = """\
# GFY003 tensor-to-cpu

*Category: host-sync · Severity: error · Removed by `graphify rewrite`: when the value only feeds host code*

## What it flags

`.cpu()`, `.to("cpu")` and `.to(torch.device("cpu"))` inside the per-iteration region of a training or inference
loop, on any value other than a known host value or loss module; also copies to the host made for you: a tensor fed
to a Hugging Face `evaluate` metric (`metric.add_batch(predictions=preds)`), and a host tensor (an item of a torch
`DataLoader` the step never moves) indexed with a model's output (`allcaps[sort_ind]`: the index is copied). A
module moved to the host in the step (`ema.to("cpu")`, an EMA offload) copies all its weights; the rewrite does not
remove that one. Not flagged: moves to the GPU (GFY301, GFY302), dtype-only `.to(...)`, and `.cpu()` in setup code,
after the loop or in an epoch loop.

## Why it breaks capture

A device-to-host copy into ordinary (pageable) memory is synchronous: the CPU waits until the GPU has produced the
tensor. Synchronizing is illegal during stream capture and invalidates it. A `non_blocking=True` copy into pinned
memory avoids the wait, but then the graph writes to the same host buffer on every replay while the Python code that
reads it ran only once, at capture; nothing tells the host when a replayed copy has landed.

## How to fix

Keep results on the device during the step and copy them out rarely. When the host copy only feeds host code
(metrics, logging, NumPy post-processing), `graphify rewrite` moves it after `g.replay()` and applies it to the
graph's static output (`static_out.cpu()`), where the sync happens outside the graph. If the host copy feeds GPU work
of the same step, restructure that work to stay on the device.

## Example

Flagged:
```python
for x, y in loader:
    out = model(x)
    loss = criterion(out, y)
    loss.backward(); opt.step(); opt.zero_grad()
    history.append(loss.detach().cpu())
```
Instead:
```python
loss_sum = torch.zeros((), device="cuda")
for x, y in loader:
    out = model(x)
    loss = criterion(out, y)
    loss.backward(); opt.step(); opt.zero_grad()
    loss_sum += loss.detach()             # in place, on the GPU
history.append(loss_sum.cpu() / len(loader))   # once per epoch
```

## Suppress

Add `# graphify: ignore[GFY003]` to the flagged line.
"""
