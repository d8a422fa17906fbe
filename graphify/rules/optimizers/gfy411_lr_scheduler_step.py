"""GFY411 lr-scheduler-step."""

from graphify.analysis.checker import code_of, kwarg
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.optimizers.shared import is_false, lr_fix, outside_called_step, scheduler_step
from graphify.rules.registry import rule

RULE = rule(
    "GFY411",
    "lr-scheduler-step",
    "lr-scheduler",
    "error",
    "`scheduler.step()` changes a float learning rate that capture froze",
    True,
    Fix(FixKind.IN_PLACE, Applicability.SAFE),
)


def _cycles_momentum(ck, scheduler, env) -> bool:
    built = ck.construction(scheduler, env)
    if built is None:
        return False
    call, module = built
    name = (module.aliases.qualify(call.func) or "").rsplit(".", 1)[-1]
    return name in ("OneCycleLR", "CyclicLR") and not is_false(kwarg(call, "cycle_momentum"))


def detect(ck):
    tensor_lr = None
    for node, site in ck.nodes():
        env = site.env
        m = scheduler_step(node, env)
        if m is None:
            continue
        tensor_lr = ck.optimizers_take_tensor_lr() if tensor_lr is None else tensor_lr
        if _cycles_momentum(ck, m[0], env):
            yield ck.finding(
                RULE,
                node,
                site,
                f"`{code_of(node)}` also cycles momentum/betas every step, which capture freezes",
                "pass `cycle_momentum=False`, or step this scheduler per epoch",
                False,
                order=(1, ck.position(node)),
            )
            continue
        yield ck.finding(
            RULE,
            node,
            site,
            f"`{code_of(node)}` changes the learning rate every step",
            lr_fix(tensor_lr),
            tensor_lr and outside_called_step(ck, site) and m[1] == "step",  # the rewrite knows torch's schedulers only
            order=(1, ck.position(node)),
        )


CASES = {
    "timm-step-update": (
        """
        sched = timm.scheduler.create_scheduler_v2(opt)
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            sched.step_update(num_updates=i)  # here
        """,
        """
        sched = timm.scheduler.create_scheduler_v2(opt)
        for epoch in range(10):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
        sched.step_update(num_updates=10)
        """,
        False,
    ),
}

DOC = """\
# GFY411 lr-scheduler-step

*Category: lr-scheduler · Severity: error · Removed by `graphify rewrite`: when the optimizer can read a tensor learning rate*

## What it flags

`scheduler.step()` on a learning-rate scheduler (built from `torch.optim.lr_scheduler`, or named like `scheduler`,
`lr_sched`, `lr_scheduler`) inside the per-iteration region of a training loop; also timm's per-update
`scheduler.step_update(num_updates)`, which the rewrite does not turn into a tensor learning rate. Not flagged: a scheduler stepped
once per epoch in an epoch loop whose step lives in an inner loop, or stepped before or after the loop.

## Why it breaks capture

With a Python-float learning rate the optimizer hands `lr` to its update kernels as a scalar argument, and capture
freezes that number into the graph. `scheduler.step()` only rewrites `param_group["lr"]` on the host: inside the
captured region it runs once, at capture; outside it, it changes a float the graph never reads again. Training
silently continues at the capture-time rate while `get_last_lr()` reports the schedule. When `lr` is a one-element
tensor, PyTorch's schedulers update it in place with `fill_`, and a capturable optimizer reads it from device memory
on every replay.

## How to fix

Give each param group a device tensor `lr` (`lr=torch.tensor(3e-4, device="cuda")`) with `capturable=True`, and
step the scheduler outside the graph, between replays. SGD reads a tensor `lr` on the host unless `fused=True`.
`graphify rewrite` keeps `scheduler.step()` eager after the replay; for optimizers with a `capturable` option it
captures the step reading a device-tensor `lr` and refreshes that tensor from `param_group["lr"]` before each replay.
Where it cannot (SGD's float `lr`, or a scheduler that also cycles betas or momentum, as OneCycleLR does), the loop is
`partially-capturable`: the rewrite replays only the model's forward and backward from CUDA graphs and keeps the
optimizer and scheduler eager.

## Example

Flagged:
```python
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, capturable=True)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-4, total_steps=steps)
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    sched.step()
```
Instead (captured by hand):
```python
opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(3e-4, device="cuda"), capturable=True)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-4, total_steps=steps)
for x, y in loader:
    static_x.copy_(x); static_y.copy_(y)
    g.replay()      # the captured opt.step() reads the lr tensor
    sched.step()    # eager: fill_()s the lr tensor for the next replay
```

## Suppress

Add `# graphify: ignore[GFY411]` to the flagged line.
"""
