#!/usr/bin/env python
"""Staged batch copies against the written ones, side by side in one process: `x.to(device)` as written
against `train_step.stage(x, device)` (what `graphify rewrite` writes), the step replayed from a CUDA graph
in both, and eager as written for reference; and the copy on a copy stream of its own (the design
runtime/staging.py did not take: its host work per copy outweighed the overlap it allows here).

Workloads (host batches, as a loader hands them):

* cnn-loader: a small MNIST-style CNN (two conv blocks, batch norm, a linear head, Adam), its batches from a
  DataLoader over host tensors (batch 100, shuffled, no workers), `pin_memory` off and on;
* mlp-list: a 3-layer MLP (batch 64, SGD with momentum), launch-bound, its batches from a list of host tensors.

Each variant runs `--steps` steps after `--warmup` steps, the GPU drained at both ends, in turns, `--repeats`
times; ms per step is the median over the repeats, with the spread (min-max). Usage (GPU):

    python bench/staging/run.py [--steps 400] [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("GRAPHIFY_CAPTURE", "always")  # compare copies, not the runtime's capture decision
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from graphify.runtime import CapturedStep  # noqa: E402

DEVICE = torch.device("cuda")


def cnn():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(7 * 7 * 32, 10),
    ).to(DEVICE)  # fmt: skip
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(DEVICE)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def loader_batches(pin: bool):
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(6000, 1, 28, 28, generator=g), torch.randint(0, 10, (6000,), generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=100, shuffle=True, pin_memory=pin, generator=g)
    while True:
        yield from loader


def list_batches():
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 64, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(16)]
    while True:
        yield from batches


WORKLOADS = {
    "cnn-loader": (cnn, lambda: loader_batches(pin=False)),
    "cnn-loader-pinned": (cnn, lambda: loader_batches(pin=True)),
    "mlp-list": (mlp, list_batches),
}
VARIANTS = ("eager", "written", "staged", "copy_stream")


_COPY_STREAMS: dict = {}


def _copy_stream(t, device):
    """The copy on a stream of its own, the current stream waiting on it by an event and the CPU for the
    copy alone: the GPU may overlap it with the replay, at the cost of more host work per copy."""
    stream = _COPY_STREAMS.get(device)
    if stream is None:
        stream = _COPY_STREAMS[device] = torch.cuda.Stream(device)
    current = torch.cuda.current_stream(device)
    with torch.cuda.stream(stream):
        out = t.to(device, non_blocking=True)
    copied = stream.record_event()
    current.wait_event(copied)
    out.record_stream(current)
    copied.synchronize()
    return out


COPIES = {"written": lambda t, device: t.to(device), "copy_stream": _copy_stream}


def run(workload: str, variant: str, steps: int, warmup: int) -> float:
    """ms per step of `steps` steps after `warmup`, the GPU drained at both ends."""
    build, batches = WORKLOADS[workload]
    model, optimizer = build()

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    wrapped = step if variant == "eager" else CapturedStep(step)
    copy = wrapped.stage if variant == "staged" else COPIES.get(variant, COPIES["written"])
    it = batches()
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            started = time.perf_counter()
        x, y = next(it)
        x, y = copy(x, DEVICE), copy(y, DEVICE)
        loss = wrapped(x, y)
        if i % 100 == 0:
            float(loss.detach())  # a log line now and then
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1e3 / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    names = args.workloads.split(",")
    times = {(w, v): [] for w in names for v in VARIANTS}
    for _ in range(args.repeats):
        for w in names:
            for v in VARIANTS:
                times[w, v].append(run(w, v, args.steps, args.warmup))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; ms per step, median of {args.repeats} (min-max)")
    print("| workload | eager, written | replayed, written | replayed, staged | replayed, on a copy stream | written / staged |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for w in names:
        cells = [f"{statistics.median(times[w, v]):.3f} ({min(times[w, v]):.3f}-{max(times[w, v]):.3f})" for v in VARIANTS]
        gain = statistics.median(times[w, "written"]) / statistics.median(times[w, "staged"])
        print(f"| {w} | {' | '.join(cells)} | {gain:.2f}× |")
    if args.json:
        args.json.write_text(json.dumps({f"{w}/{v}": t for (w, v), t in times.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
