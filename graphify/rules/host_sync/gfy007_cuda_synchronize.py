"""GFY007 cuda-synchronize."""

from graphify.analysis.checker import code_of
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.host_sync.shared import method_read
from graphify.rules.host_sync.host_tensors import host_batch_names
from graphify.rules.registry import rule

RULE = rule(
    "GFY007",
    "cuda-synchronize",
    "host-sync",
    "error",
    "`torch.cuda.synchronize()` and stream/event synchronization are illegal during capture",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)


def detect(ck):
    host_batch = host_batch_names(ck)
    for call, site in ck.calls():
        if method_read(ck, call, site, host_batch) == "synchronize":
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` blocks the host",
                "remove it from the step; time with CUDA events outside the replayed region",
                ck.host_read_removable(call, site),
            )


DOC = """\
# GFY007 cuda-synchronize

*Category: host-sync · Severity: error · Removed by `graphify rewrite`: yes*

## What it flags

`torch.cuda.synchronize()`, `stream.synchronize()` (including `torch.cuda.current_stream().synchronize()`) and
`event.synchronize()` inside the per-iteration region of a training or inference loop; they are often there to time
the step. Not flagged: `stream.wait_stream(...)`, `stream.wait_event(e)`, `event.wait()` and `event.record()`, which
order GPU work without blocking the host, and synchronization outside the step.

## Why it breaks capture

These calls block the CPU until the device, a stream or an event has finished its work. While a stream is capturing,
its work is only being recorded, not run, so CUDA rejects the call (`operation not permitted when stream is
capturing`) and invalidates the capture. Inside a graph the call is not needed for ordering anyway: replayed kernels
run in recorded order, and cross-stream dependencies are captured from `wait_stream`/`wait_event`.

## How to fix

Drop synchronizations used only for ordering; use `wait_stream`/`wait_event` between streams. Time whole loops with
CUDA events recorded outside the step. `graphify rewrite` takes the call out of the captured step and runs it after
`g.replay()`, where it waits for the replay just as it waited for the eager step.

## Example

Flagged:
```python
for x, y in loader:
    t0 = time.perf_counter()
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    torch.cuda.synchronize()
    step_ms.append(1e3 * (time.perf_counter() - t0))
```
Instead:
```python
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
end.record(); end.synchronize()
print(start.elapsed_time(end) / len(loader), "ms/step")
```

## Suppress

Add `# graphify: ignore[GFY007]` to the flagged line.
"""
