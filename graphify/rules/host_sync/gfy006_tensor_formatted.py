"""GFY006 tensor-formatted."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.logging_calls import is_logging_call
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.host_sync.shared import READ_AFTER, call_read
from graphify.rules.registry import rule

RULE = rule(
    "GFY006",
    "tensor-formatted",
    "host-sync",
    "error",
    "a tensor printed, logged or formatted into a string is read on the host",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def _fstring_parts(expr):
    if isinstance(expr, cst.FormattedString):
        return [p for p in expr.parts if isinstance(p, cst.FormattedStringExpression)]
    if isinstance(expr, cst.ConcatenatedString):  # f"..." f"..." over several lines
        return _fstring_parts(expr.left) + _fstring_parts(expr.right)
    return []


def _logged(ck, call: cst.Call, site):
    env = site.env
    tensors = [a.value for a in call.args if env.is_tensor(a.value)]
    tensors += [fs.expression for a in call.args for fs in _fstring_parts(a.value) if ck.is_tensor_here(fs.expression, site)]
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "format" and env.is_tensor(call.func.value):
        tensors.append(call.func.value)
    if tensors:
        # reported where the tensor is read: the f-string line of a call that spans lines
        module = site.block.module
        at = tensors[0] if module.position(tensors[0]).start.line != module.position(call).start.line else call
        yield ck.finding(
            RULE,
            at,
            site,
            f"tensor `{code_of(tensors[0])}` printed or logged from the step",
            f"log `{code_of(tensors[0])}.item()` after the step instead",
            ck.host_read_removable(call, site),
            order=(ck.position(call),),
        )


def detect(ck):
    for node, site in ck.nodes():
        env = site.env
        if isinstance(node, cst.Call):
            read = call_read(node, env)
            if read == "log":
                yield from _logged(ck, node, site)
            elif read == "format":
                yield ck.finding(RULE, node, site, "tensor formatted into a string", READ_AFTER, ck.host_read_removable(node, site))
        elif isinstance(node, cst.FormattedStringExpression) and env.is_tensor(node.expression):
            if not any(isinstance(a, cst.Call) and is_logging_call(a, env) for a in site.ancestors):
                yield ck.finding(
                    RULE,
                    node,
                    site,
                    f"tensor `{code_of(node.expression)}` formatted into a string",
                    f"format `{code_of(node.expression)}.item()` outside the step, or log the tensor after the replay",
                    ck.host_read_removable(node, site),
                )


CASES = {
    "tensor-dict-logged": (
        """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            log_dict = {"loss": loss.detach(), "step": step}
            metric_logger.log_dict(log_dict, step=step)  # here
        """,
        """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            log_dict = {"loss": float(loss), "step": step}
            metric_logger.log_dict(log_dict, step=step)
        """,
        True,
    ),
    "concatenated-f-string": (
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            print(
                f"step "
                f"loss {loss:.3f}"  # here
            )
        """,
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            avg = round(meter.avg, 4)
            print(
                f"step "
                f"avg {avg:.3f}"
            )
        avg = torch.tensor(avg)
        """,
        True,
    ),
}

DOC = """\
# GFY006 tensor-formatted

*Category: host-sync · Severity: error · Removed by `graphify rewrite`: when the value only feeds host code*

## What it flags

A value known to hold a tensor (or a dict holding one, `{"loss": loss}`) that is passed to `print`, a logger, a progress bar (`set_postfix`,
`set_description`) or a metric logger, or formatted into a string with an f-string, `str()`, `repr()` or
`.format()`, inside the per-iteration region of a training or inference loop. A metric logger (`metric_logger.update(
**loss_dict)`, `logger.log_dict(d)`) fed tensors reads them on the host, unless it is an object of a class of the
checked file, whose own body is checked instead. Not flagged: formatting host values
(`f"step {i}"`, a number already read with `.item()`, which GFY001 reports; a log call with only host values is
GFY511); `%`-formatting and `format()` are not detected.

## Why it breaks capture

Turning a CUDA tensor into text reads its elements on the host, so the CPU waits for the GPU to compute them. That
synchronization is illegal during stream capture and invalidates it. The formatting and the output are CPU work that
a graph does not record: on replay, nothing would be printed or logged.

## How to fix

Log from host values read outside the step, and not every step if you can avoid it. When the formatted text only
feeds host code, `graphify rewrite` moves the call after `g.replay()` and formats the graph's static output
(`static_loss.item()`), once per replay and outside the graph.

## Example

Flagged:
```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    pbar.set_postfix_str(f"loss={loss:.4f}")
```
Instead (captured by hand):
```python
for x, y in loader:
    static_x.copy_(x); static_y.copy_(y)
    g.replay()                      # forward, loss, backward and opt.step(), captured once
    pbar.set_postfix_str(f"loss={static_loss.item():.4f}")
```

## Suppress

Add `# graphify: ignore[GFY006]` to the flagged line.
"""
