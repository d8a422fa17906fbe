"""GFY613 ddp-model-in-step."""

from graphify.analysis.checker import code_of
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.distributed.shared import followed_calls, runs_ddp
from graphify.rules.registry import rule

RULE = rule(
    "GFY613",
    "ddp-model-in-step",
    "distributed",
    "error",
    "a DistributedDataParallel model needs side-stream construction and 11 warmup steps",
    True,
    Fix(FixKind.SIDE_STREAM, Applicability.GUARDED),
)


def detect(ck):
    seen = set()
    followed = followed_calls(ck)
    for node, site in ck.nodes():
        env = site.env
        if runs_ddp(node, env, followed):
            built = ck.construction(node.func, env)
            target = built if built is not None else (node, env.module)
            if id(target[0]) not in seen:
                seen.add(id(target[0]))
                yield ck.finding_at(
                    RULE,
                    target[0],
                    target[1],
                    f"`{code_of(target[0])}` runs DDP hooks in the step",
                    "build DDP on a side stream, turn NCCL async error handling off and warm up 11 steps before capture",
                    order=(ck.position(node),),
                )


DOC = """\
# GFY613 ddp-model-in-step

*Category: distributed · Severity: error · Removed by `graphify rewrite`: when the `DistributedDataParallel(...)` call is in the rewritten file*

## What it flags

Calling a model wrapped in `torch.nn.parallel.DistributedDataParallel` (or its `.forward`) inside the
per-iteration region of a training loop. The diagnostic sits on the `DistributedDataParallel(...)` construction
when graphify finds it, else on the call. Not flagged: unwrapped models, and DDP models used only outside analysed
loops.

## Why it breaks capture

DDP's backward hooks launch NCCL all-reduces for its gradient buckets. Whole-step capture of DDP needs: the
wrapper built on the stream the step is captured on (DDP keeps each parameter's gradient accumulator from
its construction, and autograd runs it on that stream); at least 11 DDP-enabled eager iterations before
capture instead of the usual 3 (DDP rebuilds its buckets early on); the same capture decision on every rank
(NCCL's rule for captured collectives); and the graphs freed before the process group is destroyed, which
otherwise waits for ever. `find_unused_parameters=True` walks the autograd graph on the host every step.

## How to fix

`graphify rewrite` does it: the construction becomes `build_on_capture_stream(DDP, model, ...)`, and the
runtime warms a DDP step up for 11 steps, has the ranks agree on each capture (all stay eager if one
failed), and frees the graphs before `destroy_process_group`. The runtime checks on the first call what
the source cannot tell: a DDP built elsewhere (another file, a library), with `find_unused_parameters=True`
or without NCCL, and `DataParallel` over several GPUs or FSDP models, leave the step eager with one warning.
Partial capture never graphs a DDP model alone (its all-reduces fire from hooks that graph would skip): a
model the source shows wrapped refuses it with this code, one wrapped out of sight runs eagerly.

By hand: build DDP inside `with torch.cuda.stream(s):`, run 11 or more eager steps on `s`, capture on `s`,
and delete the graphs before `destroy_process_group()`.

## Example

Flagged:
```python
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
model = DDP(net.cuda(), device_ids=[rank])
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead (set up for whole-step capture; what `graphify rewrite` writes):
```python
dist.init_process_group("nccl")
model = build_on_capture_stream(DDP, net.cuda(), device_ids=[rank])
# then: >= 11 eager steps on the capture stream, capture, replay
```

## Suppress

Add `# graphify: ignore[GFY613]` to the flagged line.
"""
