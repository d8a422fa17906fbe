"""On a GPU, `rewrite --defer-host-reads`: DeferredReads copies to pinned host memory without waiting, and
hands back the previous step's values without waiting for the work queued since; a rewritten script with
deferred reads replays and prints what the rewrite without them prints, line for line."""

from __future__ import annotations

import time

import torch
from in_process import printed_by

from graphify.config import Settings
from graphify.rewrite import rewrite_source
from graphify.runtime import DeferredReads

_SCRIPT = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
data = [(torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)) for _ in range(24)]
history = []
for epoch in range(2):
    for step, (x, y) in enumerate(data):
        x, y = x.cuda(), y.cuda()
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        acc = (logits.argmax(1) == y).float().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item())
        if step % 5 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item()!r} acc {acc.item()!r} n {x.size(0)}")
print(len(history), repr(sum(history)))
"""


def test_push_waits_only_for_the_previous_steps_copy():
    reads = DeferredReads()
    out = torch.full((1024,), 1.0, device="cuda")
    torch.cuda.synchronize()
    assert list(reads.push(copy=(out,), value=(0,))) == []
    torch.cuda._sleep(500_000_000)  # the next replay: long GPU work, then it overwrites the output
    out.add_(1.0)
    start = time.perf_counter()
    ((held, step),) = reads.push(copy=(out,), value=(1,))
    waited = time.perf_counter() - start
    busy = not torch.cuda.current_stream().query()
    assert busy and waited < 0.05, (busy, waited)  # the GPU is still at work: push did not wait for it
    assert held.device.type == "cpu" and held.is_pinned() and step == 0 and bool((held == 1.0).all())
    ((last, step),) = reads.flush()
    assert step == 1 and bool((last == 2.0).all())


def test_a_deferred_rewrite_replays_and_prints_the_same_lines(tmp_path, always_capture):
    settings = Settings()
    settings.defer_host_reads = True
    plain = rewrite_source(_SCRIPT, "train.py").code
    deferred = rewrite_source(_SCRIPT, "train.py", settings).code
    assert "train_step_reads.push(copy=(loss, acc), keep=(x,), value=(step,))" in deferred
    printed = {}
    for name, code in (("plain", plain), ("deferred", deferred)):
        path = tmp_path / f"{name}.py"
        path.write_text(code)
        printed[name] = printed_by(path).splitlines()
    assert printed["deferred"] == printed["plain"] and len(printed["plain"]) == 11
