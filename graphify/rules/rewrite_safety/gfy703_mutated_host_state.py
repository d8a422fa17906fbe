"""GFY703 mutated-host-state."""

import libcst as cst

from graphify.analysis.calls import iter_nodes
from graphify.analysis.checker import code_of
from graphify.model import Fix, Partial
from graphify.rules.registry import rule

RULE = rule(
    "GFY703",
    "mutated-host-state",
    "rewrite-safety",
    "error",
    "an attribute or module mode the step depends on is changed in the loop or inside the step",
    False,
    Fix(partial=Partial.NEVER, advice="keep such state on the device, or constant for the loop; change modes outside the step"),
)


_HYPERPARAMETERS = {"weight_decay", "momentum", "betas", "eps", "dampening"}  # "lr" is GFY412's


def _param_group_key(target: cst.BaseExpression, site) -> str | None:
    """The key of `opt.param_groups[0]["weight_decay"]`, or of `group["momentum"]` inside
    `for group in opt.param_groups:`."""
    if not isinstance(target, cst.Subscript) or len(target.slice) != 1 or not isinstance(target.slice[0].slice, cst.Index):
        return None
    key = target.slice[0].slice.value
    if not isinstance(key, cst.SimpleString):
        return None
    group = target.value
    if isinstance(group, cst.Subscript):
        group = group.value  # opt.param_groups[0]
    elif isinstance(group, cst.Name):
        loops = [
            a
            for a in site.ancestors
            if isinstance(a, cst.For) and any(n is not group and _same_name(n, group) for n in iter_nodes(a.target))
        ]
        group = loops[-1].iter if loops else None
    in_groups = group is not None and any(isinstance(n, cst.Attribute) and n.attr.value == "param_groups" for n in iter_nodes(group))
    return key.value.strip("'\"") if in_groups else None


def _same_name(node: cst.CSTNode, name: cst.Name) -> bool:
    return isinstance(node, cst.Name) and node.value == name.value


def detect(ck):
    """`param_group["weight_decay"] = wd_schedule[it]` in the loop: the optimizer step reads the value on the
    host, so the captured step keeps the one it was captured with."""
    for node, site in ck.nodes():
        if not isinstance(node, cst.Assign) or isinstance(node.value, (cst.Integer, cst.Float)):
            continue
        key = next((k for t in node.targets if (k := _param_group_key(t.target, site)) in _HYPERPARAMETERS), None)
        if key is not None:
            yield ck.finding(
                RULE,
                node,
                site,
                f"`{code_of(node)}` changes the optimizer's `{key}` in the loop; the captured step keeps the value it was captured with",
                "keep it constant while the step loop runs (change it between epochs)",
                False,
                order=(2,),
            )


CASES = {
    "param-group-hyperparameter": (
        """
        wd_schedule = np.linspace(0.04, 0.4, 1000)
        for it, (x, y) in enumerate(loader):
            for i, group in enumerate(opt.param_groups):
                group["lr"] = 0.1 / (it + 1)
                group["weight_decay"] = wd_schedule[it]  # here
            opt.param_groups[0]["momentum"] = 0.9 + it / 1e4  # here
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        """,
        """
        for epoch in range(10):
            for group in opt.param_groups:
                group["weight_decay"] = 0.1 * epoch
            for it, (x, y) in enumerate(loader):
                stats = {}
                stats["momentum"] = it / 1e4
                for group in opt.param_groups:
                    group["weight_decay"] = 0.0
                criterion(model(x), y).backward()
                opt.step(); opt.zero_grad()
        """,
        False,
    ),
    "requires-grad-of-a-module-not-a-tensor": (
        """
        for x, y in loader:
            out = model(x)
            model.requires_grad_(False)  # here
            loss = criterion(out, y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def penalty(real, fake):
            alpha = torch.rand(real.size(0), 1, device=real.device)
            mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
            grads = torch.autograd.grad(model(mixed).sum(), mixed, create_graph=True)[0]
            return ((grads.norm(2, dim=1) - 1) ** 2).mean()
        for x, y in loader:
            loss = criterion(model(x), y) + penalty(x, x.flip(0))
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        False,
    ),
    "helper-changes-outer-list": (
        """
        history = []
        def track(out, y):
            history.append((out.argmax(1) == y).float().mean())  # here
            return out
        for x, y in loader:
            out = track(model(x), y)
            loss = criterion(out, y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def track(out, y):
            found = []
            found.append((out.argmax(1) == y).float().mean())
            return found
        for x, y in loader:
            out = model(x)
            acc = track(out, y)
            loss = criterion(out, y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        False,
    ),
    "item-or-attribute-changed-between-steps": (
        """
        import argparse
        args = argparse.ArgumentParser().parse_args()
        weights = {"aux": 0.0}
        temps = [1.0]
        for epoch in range(4):
            args.accum = 2 + epoch  # here
            temps.append(1 / (epoch + 1))  # here
            for i, (x, y) in enumerate(loader):
                weights["aux"] = i / 100  # here
                weights.update(main=1 - i / 100)  # here
                for k in range(args.accum):
                    out = model(x[k::args.accum]) / temps[-1]
                    loss = (criterion(out, y[k::args.accum]) * weights["aux"]) * weights["main"]
                    loss.backward()
                opt.step(); opt.zero_grad()
        """,
        """
        import argparse
        args = argparse.ArgumentParser().parse_args()
        weights = {"aux": 0.5}
        logs = {}
        history = []
        scaler = torch.cuda.amp.GradScaler()
        for epoch in range(4):
            logs["epoch"] = epoch
            history.append(epoch)
            for i, batch in enumerate(loader):
                batch["scale"] = 2.0
                logs["step"] = i
                logs.update(seen=i)
                scaler.update()
                for k in range(args.accum):
                    loss = criterion(model(batch["x"][k::args.accum]), batch["y"]) * weights["aux"] * batch["scale"]
                    loss.backward()
                opt.step(); opt.zero_grad()
        """,
        False,
    ),
    "global-rebound-by-a-called-function": (
        """
        scale = 1.0
        temperature = 1.0
        def decay():
            global scale
            scale *= 0.5
        def cool():
            global temperature  # here
            temperature *= 0.9
        for epoch in range(4):
            decay()  # here
            for x, y in loader:
                cool()
                loss = criterion(model(x) / temperature, y) * scale
                loss.backward(); opt.step(); opt.zero_grad()
        def train():
            margin = 1.0
            def shrink():
                nonlocal margin
                margin *= 0.9
            for epoch in range(4):
                shrink()  # here
                for x, y in loader:
                    loss = criterion(model(x), y) + margin
                    loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        scale = 1.0
        best = 0.0
        def remember(value):
            global best
            best = max(best, value)
        for epoch in range(4):
            remember(epoch)
            for x, y in loader:
                loss = criterion(model(x), y) * scale
                loss.backward(); opt.step(); opt.zero_grad()
                remember(0.5)
        """,
        False,
    ),
    "module-changed-by-apply-or-setattr": (
        """
        def set_dropout(m, p):
            if isinstance(m, nn.Dropout):
                m.p = p
        for epoch in range(4):
            model.apply(lambda m: set_dropout(m, 0.5 / (epoch + 1)))  # here
            for x, y in loader:
                setattr(criterion, "label_smoothing", 0.1)  # here
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def init_weights(m):
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        model.apply(init_weights)
        setattr(criterion, "label_smoothing", 0.1)
        for epoch in range(4):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
        """,
        False,
    ),
}

DOC = """\
# GFY703 mutated-host-state

*Category: rewrite-safety · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

Host state the step depends on that changes while the loop runs: an attribute or a container's item assigned (or
`setattr`, a dict or list changed by `update`, `append`..., a module changed by `apply`) in the loop, or in a loop
around it between its runs (`args.accum = 8` in the epoch loop), and read by the step
(`self.global_step += 1` read by `training_step`, `loss_weights["aux"] = ramp` read in the loss), a name that a
function the loop (or a loop around it) calls rebinds with `global` or `nonlocal`, an attribute assigned under an object the step
hands to code graphify cannot see (`model.drop.p = ...` while the step calls `model(x)`), and attribute
assignments, `global` counters or `.train()`/`.eval()` calls inside the step or its `forward`, and a function the
step calls that changes a container it did not make itself (`history.append(acc)` on a global, an argument or an
attribute; a list it builds and returns is fine). Reported by the
rewrite planner at every statement where it finds one, even when another breaker already blocks the loop. Also,
wherever the loop sets it: an optimizer hyperparameter other than the learning rate (GFY412's) assigned in a
param group (`param_group["weight_decay"] = wd_schedule[it]`), which the optimizer step reads on the host.
And what the loop (or a loop around it) rebinds or changes in place that a model's method reads unbound: a module
name, numpy array (`NOISE.fill(s)`), dict, list or object, an outer loop's `epoch`, a container attribute the model
made (`model.history.append(i)`), a local class's closure variable; and, for a module-level loop or a `global`, a
module function the step calls (a loss reading `WEIGHT`). Between runs (in a loop around it, or in loops that call its
function), the file's functions and methods called there are followed (`set_dropout(model, p)`, `criterion.set_gamma(g)`, `for m in model.modules(): m.p = p`); a list, dict or set the step's statements fill (`preds.append(model(x))`) would grow at capture only.

## Why it breaks capture

Capture records the kernels one run of the Python produced. A dropout probability, a counter or a mode read at
capture is frozen into the graph; later assignments change the Python object, not the replayed kernels. The
step keeps training with the state it had at capture (the runtime catches a value that moves every step).

## How to fix

Keep such state on the device (a tensor updated in place), or make it constant for the loop. Switch modes outside the loop body's
step (periodic evaluation before or after the step is fine: graphify keys its graphs on the modules' modes).

## Example

Flagged:
```python
for step, (x, y) in enumerate(loader):
    model.drop.p = 0.5 * (1 - step / total)
    loss = criterion(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
```
Instead:
```python
model.drop.p = 0.1  # constant for the loop
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
```

## Suppress

`# graphify: ignore[GFY703]` hides the diagnostic from `check`; the rewrite still leaves the loop alone.
"""
