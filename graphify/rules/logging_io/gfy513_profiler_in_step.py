"""GFY513 profiler-in-step."""

from graphify.analysis.checker import code_of
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.logging_io.shared import logs, steps_profiler
from graphify.rules.registry import rule

RULE = rule(
    "GFY513",
    "profiler-in-step",
    "logging-io",
    "warning",
    "profiler schedules and CUDA memory recording advance on the host, once per step; a replay does not call them",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def detect(ck):
    for call, site in ck.calls():
        if not logs(call, site) and steps_profiler(call, site.env):  # else GFY511
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` would run only once, at capture",
                "step the profiler between replays, outside the captured region",
                True,
                order=(ck.position(call), 1),
            )


CASES = {
    "memory-history": (
        """
        for step, (x, y) in enumerate(loader):
            if step == 5:
                torch.cuda.memory._record_memory_history()  # here
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        """,
        """
        torch.cuda.memory._record_memory_history()
        for step, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        """,
        True,
    ),
}

DOC = """\
# GFY513 profiler-in-step

*Category: logging-io · Severity: warning · Removed by `graphify rewrite`: yes*

## What it flags

Profiler control inside the per-iteration region of a loop: `prof.step()` on a `torch.profiler.profile(...)` object
(or an object named `profiler`/`prof`), other `torch.profiler` calls, and CUDA memory recording
(`torch.cuda.memory._record_memory_history`, `_dump_snapshot`). Not flagged: a profiler entered around the loop.

## Why it breaks capture

`prof.step()` advances the profiler's wait/warmup/active schedule on the host and memory recording is switched on
the host: both are host calls that a graph does not record. Inside the captured region they run once, at capture,
and the schedule stops advancing, so the trace covers the wrong steps or none.

## How to fix

Step the profiler and switch memory recording eagerly, between replays. `graphify rewrite` moves the call after
`g.replay()`; a trace then shows each replay as one graph launch.

## Example

Flagged:
```python
prof = torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=3))
prof.start()
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    prof.step()
```
Instead (captured by hand):
```python
prof = torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=3))
prof.start()
for x, y in loader:
    static_x.copy_(x); static_y.copy_(y)
    g.replay()
prof.stop()
```

## Suppress

Add `# graphify: ignore[GFY513]` to the flagged line.
"""
