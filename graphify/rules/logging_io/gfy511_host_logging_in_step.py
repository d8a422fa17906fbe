"""GFY511 host-logging-in-step."""

from graphify.analysis.checker import code_of
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.logging_io.shared import logs
from graphify.rules.registry import rule

RULE = rule(
    "GFY511",
    "host-logging-in-step",
    "logging-io",
    "warning",
    "print, logging, progress bars and metric loggers run only once, at capture",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def detect(ck):
    for call, site in ck.calls():
        if logs(call, site):
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` would run only once, at capture",
                "log after the replay, from the graph's static outputs",
                True,
                order=(ck.position(call), 1),
            )


CASES = {
    "logger-from-factory": (
        """
        import tracking
        wb = tracking.get_wandb_backend()
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            wb.log({"lr": 0.1})  # here
        """,
        """
        import tracking
        wb = tracking.get_model_backend()
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            wb.log({"lr": 0.1})
        """,
        True,
    ),
}

DOC = """\
# GFY511 host-logging-in-step

*Category: logging-io · Severity: warning · Removed by `graphify rewrite`: yes*

## What it flags

`print(...)`, `logging` and `wandb`/`mlflow` calls, Lightning's `self.log`, and any method of an object that a
reporting library or a class named as one built: `tqdm(...)` (`update`, `set_description`, `set_postfix`),
`SummaryWriter()` (`add_scalar`, `add_audio`), `Logger(...)`, `Visualizer(...)`, whatever the variable is called, and
also when it is a parameter. Also flagged: figures put on screen (`plt.show`, `plt.pause`), and calls kept for their
effect to a function in a module the analysis does not have, named for reporting (`visual(gt, pred, path)`,
`log(logger, step, losses=losses)`, `utils.summarize(...)`). A class of the checked code is judged by its body: a
`MetricLogger` that only sums is bookkeeping. Not flagged: wrapping the loader in `tqdm(...)`, a call whose result
is used (`img = plot_to_numpy(x)` computes), and calls in an epoch loop, before or after the step loop.

## Why it breaks capture

A graph records GPU work only. Host code inside the captured region, a print or a log call, runs once, while
capturing, and never during replays, so the log stops after the first step without any error. When the logged value
is a tensor, reading it is also a host sync (GFY001, GFY006), which capture forbids.

## How to fix

Log outside the captured step, from the graph's static outputs after the replay, and every N steps rather than every
step to limit syncs. `graphify rewrite` moves the call after `g.replay()` and points tensor arguments at the static
outputs.

## Example

Flagged:
```python
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 50 == 0:
        wandb.log({"loss": loss.item()}, step=step)
```
Instead (captured by hand):
```python
for step, (x, y) in enumerate(loader):
    static_x.copy_(x); static_y.copy_(y)
    g.replay()
    if step % 50 == 0:
        wandb.log({"loss": static_loss.item()}, step=step)   # host code, after the replay
```

## Suppress

Add `# graphify: ignore[GFY511]` to the flagged line.
"""
