"""GFY251 loader-without-drop-last."""

from graphify.analysis.checker import code_of, is_true, kwarg
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.registry import rule
from graphify.rules.shapes.shared import BUCKETING_LOADERS, loaders

RULE = rule(
    "GFY251",
    "loader-without-drop-last",
    "dynamic-shape",
    "warning",
    "a DataLoader without `drop_last=True` yields a smaller last batch",
    True,
    Fix(FixKind.IN_PLACE, Applicability.SAFE),
)


def detect(ck):
    for index, (call, loader_env) in enumerate(loaders(ck)):
        if loader_env.qualify(call.func) in BUCKETING_LOADERS:
            continue  # GFY252
        if not is_true(kwarg(call, "drop_last")) and kwarg(call, "batch_sampler") is None:
            yield ck.finding_at(
                RULE,
                call,
                loader_env.module,
                f"`{code_of(call, 50)}` has no `drop_last=True`: the last batch can be smaller",
                "pass `drop_last=True`, or let graphify run the partial last batch eagerly behind a shape guard",
                order=(0, index, 2),
            )


CASES = {
    "loader-from-tuple-and-prepare": (
        """
        def get_loaders(ds):
            train = torch.utils.data.DataLoader(ds, batch_size=8, drop_last=True)
            valid = torch.utils.data.DataLoader(ds, batch_size=8)  # here
            return train, valid
        train_dl, valid_dl = get_loaders(None)
        model, train_dl, valid_dl = accelerator.prepare(model, train_dl, valid_dl)
        with torch.no_grad():
            for x, y in valid_dl:
                out = model(x)
        """,
        """
        def get_loaders(ds):
            train = torch.utils.data.DataLoader(ds, batch_size=8, drop_last=True)
            valid = torch.utils.data.DataLoader(ds, batch_size=8, drop_last=True)
            return train, valid
        train_dl, valid_dl = get_loaders(None)
        model, train_dl, valid_dl = accelerator.prepare(model, train_dl, valid_dl)
        with torch.no_grad():
            for x, y in valid_dl:
                out = model(x)
        """,
        True,
    ),
    "loader-attribute-from-init": (
        """
        class Trainer:
            def __init__(self, ds):
                dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)  # here
                self.dl = iter(accelerator.prepare(dl))
            def train(self):
                for _ in range(100):
                    x, y = next(self.dl)
                    loss = criterion(model(x), y)
                    loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        class Trainer:
            def __init__(self, ds):
                dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, drop_last=True)
                self.dl = iter(accelerator.prepare(dl))
            def train(self):
                for _ in range(100):
                    x, y = next(self.dl)
                    loss = criterion(model(x), y)
                    loss.backward(); opt.step(); opt.zero_grad()
        """,
        True,
    ),
    "loader-handed-down-two-calls": (
        """
        def train_epoch(model, loader):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
        def train(model, loader, epochs):
            for epoch in range(epochs):
                train_epoch(model, loader)
        def main():
            loader = torch.utils.data.DataLoader(None, batch_size=8, shuffle=True)  # here
            train(model, loader, 10)
        """,
        """
        def train_epoch(model, loader):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
        def train(model, loader, epochs):
            for epoch in range(epochs):
                train_epoch(model, loader)
        def main():
            loader = torch.utils.data.DataLoader(None, batch_size=8, shuffle=True, drop_last=True)
            train(model, loader, 10)
        """,
        True,
    ),
}

DOC = """\
# GFY251 loader-without-drop-last

*Category: dynamic-shape · Severity: warning · Removed by `graphify rewrite`: yes*

## What it flags

A `torch.utils.data.DataLoader(...)` built without `drop_last=True` whose batches an analysed training or inference
loop draws (directly, through `enumerate`/`iter`/`tqdm`/`cycle`/`islice`, or with `next()`); the loader is traced
through `accelerator.prepare(...)`, the value or tuple a function of the file returns (`train_dl, eval_dl =
get_dataloaders()`), and an attribute set in another method (`self.dl = cycle(dl)` in `__init__`). The diagnostic
sits on the `DataLoader` call. Not flagged: `drop_last=True`, loaders given a `batch_sampler=` (which decides batch sizes),
and loaders that no analysed loop iterates.

## Why it breaks capture

Unless the dataset size is a multiple of the batch size, the last batch of each epoch is smaller. A graph replays
fixed shapes: its static input buffers and every kernel were set up for the captured batch size. `copy_` refuses a
smaller batch (a batch of one it broadcasts over the whole buffer), and copying one into the leading rows leaves the
rest of the previous batch there, to flow into the loss and gradients. A warning: one step per epoch is affected.

## How to fix

Pass `drop_last=True` (each epoch then skips fewer than `batch_size` samples, different ones when shuffling), or pad
the last batch to full size and mask the padded rows out of the loss. `graphify rewrite` keeps every batch: before
each replay it compares the batch's shapes, dtypes and devices with the captured ones, and runs a batch that differs
(the partial last one) through the original step eagerly, on the same parameters and optimizer state.

## Example

Flagged:
```python
loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=4)
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=4, drop_last=True)
```
or, as the rewrite does:
```python
for x, y in loader:
    if x.shape != static_x.shape:
        eager_step(x, y)            # the partial last batch
        continue
    static_x.copy_(x); static_y.copy_(y)
    g.replay()
```

## Suppress

Add `# graphify: ignore[GFY251]` to the `DataLoader(...)` line.
"""
