"""GFY512 file-io-in-step."""

import libcst as cst

from graphify.analysis.calls import is_periodic_gpu_branch
from graphify.analysis.checker import code_of
from graphify.analysis.names import dotted
from graphify.analysis.statements import walk
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.logging_io.shared import FILE_IO, FILE_SYSTEM, logs, steps_profiler, writes_files
from graphify.rules.registry import rule

RULE = rule(
    "GFY512",
    "file-io-in-step",
    "logging-io",
    "warning",
    "`torch.save` and file writes in the step run only once, at capture",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def _periodic_saves(call: cst.Call, site, ck):
    """File writes in a function of this file called from periodic work (`if step % k == 0: ...; self.save(k)`):
    the step's walk does not enter calls there, as that block runs eagerly between replays, but a checkpoint
    written there is still a host effect of the step as written."""
    if not any(isinstance(a, cst.If) and is_periodic_gpu_branch(a, site.env) for a in site.ancestors):
        return
    module, func = site.block.module, call.func
    cls = site.env.func.cls if site.env.func is not None else None
    if isinstance(func, cst.Name) and func.value in module.functions:
        callee = module.functions[func.value]
    elif isinstance(func, cst.Attribute) and dotted(func.value) == "self" and cls is not None:
        callee = module.method(cls, func.attr.value)
    else:
        return
    for node in walk(callee.body) if callee is not None else ():
        if type(node) is cst.Call and (module.aliases.qualify(node.func) or "") in FILE_IO | FILE_SYSTEM:
            yield ck.finding_at(
                RULE,
                node,
                module,
                f"`{code_of(node)}` (called from periodic work in the step) would run only once, at capture",
                "save between replays, outside the captured region",
                True,
                order=(ck.position(call), 0),
            )


def detect(ck):
    for call, site in ck.calls():
        yield from _periodic_saves(call, site, ck)
        if not logs(call, site) and not steps_profiler(call, site.env) and writes_files(call, site):  # else GFY511, GFY513
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` would run only once, at capture",
                "save between replays, outside the captured region",
                True,
                order=(ck.position(call), 1),
            )


CASES = {
    "save-helper-in-periodic-work": (
        """
        def save(step):
            torch.save(model.state_dict(), f"ckpt-{step}.pt")  # here
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            if i % 1000 == 0:
                model.eval()
                with torch.no_grad():
                    sample = model(x)
                save(i)
        """,
        """
        def save(step):
            print(f"ckpt-{step}.pt")
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            if i % 1000 == 0:
                model.eval()
                with torch.no_grad():
                    sample = model(x)
                save(i)
        """,
        True,
    ),
    "checkpoint-rotation": (
        """
        for step, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
            if step % 100 == 0:
                shutil.rmtree(f"ckpt-{step - 300}", ignore_errors=True)  # here
        """,
        """
        for step, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        shutil.rmtree("ckpt-old", ignore_errors=True)
        """,
        True,
    ),
    "save-function": (
        """
        for step, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
            if step % 100 == 0:
                torchvision.utils.save_image(x, f"batch-{step}.png")  # here
        """,
        """
        for step, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        torchvision.utils.save_image(x, "last-batch.png")
        """,
        True,
    ),
    "file-write": (
        """
        with open("losses.txt", "w") as out:
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
                out.write("step\\n")  # here
        """,
        """
        with open("losses.txt", "w") as out:
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
            out.write("done\\n")
        """,
        True,
    ),
}

DOC = """\
# GFY512 file-io-in-step

*Category: logging-io · Severity: warning · Removed by `graphify rewrite`: yes*

## What it flags

File I/O inside the per-iteration region of a training or inference loop, typically periodic checkpoints under a
step-counter condition: `torch.save`, `open(...)` (in any mode), `np.save`/`np.savez`, `json.dump`, `pickle.dump`,
`shutil.copy`, `write` on a file it opened, checkpoint rotation (`os.listdir`, `os.remove`, `os.makedirs`,
`shutil.rmtree`, `shutil.move`), and functions and methods named `save_*` (`save_image`, `save_pretrained`), figures and images saved
(`plt.savefig`, `fig.savefig`, `Image.fromarray(a).save(path)`), and calls kept for their effect to a function in a
module the analysis does not have, named for saving (`save(model, dir)`, `utils.saveimg(x, path)`, `cv2.imwrite`); also `torch.save` and the like inside a function of the file called from
periodic work in the step (`if step % k == 0: sample(); self.save(milestone)`), which the analysis does not
otherwise enter. Not
flagged: checkpoints in an epoch loop or after the loop, and file access in setup code.

## Why it breaks capture

File I/O is host work, which a graph does not record: inside the captured region the write happens once, at capture,
and periodic checkpoints silently stop. `torch.save` of CUDA tensors also copies them to the host, waiting for the
GPU, a synchronization that capture forbids.

## How to fix

Run the I/O eagerly after the replay. The graph updates parameters and optimizer state in place, so
`model.state_dict()` and `opt.state_dict()` taken between replays hold the current values. `graphify rewrite` moves
the call after `g.replay()`. Resume from a checkpoint before warmup and capture: `Optimizer.load_state_dict` replaces
the state tensors, and a graph captured earlier would keep updating the old ones.

## Example

Flagged:
```python
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 1000 == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"ckpt_{step}.pt")
```
Instead (captured by hand):
```python
for step, (x, y) in enumerate(loader):
    static_x.copy_(x); static_y.copy_(y)
    g.replay()
    if step % 1000 == 0:   # eager, between replays
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"ckpt_{step}.pt")
```

## Suppress

Add `# graphify: ignore[GFY512]` to the flagged line.
"""
