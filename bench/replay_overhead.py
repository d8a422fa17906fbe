#!/usr/bin/env python
"""Host cost of a replayed call of CapturedStep, on the CPU: what graphify adds to a hand-written replay.

A CapturedStep is driven through warmup and capture on CPU tensors, its graph a no-op whose `replay()`
does nothing (the capture runs the step once, eagerly, under the same gradient watch and optimizer
settings as a real capture); every check of the replay path then runs as on CUDA. Each repeat times a
block of calls of the step and, in turn, a block of the hand-written loop (copy the inputs into the
static buffers, replay): the difference of their medians is graphify's host cost a call.

    python bench/replay_overhead.py                  # both models, 15 alternating repeats
    python bench/replay_overhead.py --profile tiny   # where the time goes (cProfile, top 25)

Models: `tiny` is bench/workloads/tiny.py (2-layer MLP, SGD: 5 modules, 4 parameters); `wide` is 75
blocks of Linear, LayerNorm and ReLU under AdamW with a tensor learning rate (227 modules, 300 parameters).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path

import importlib

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))  # after PYTHONPATH: another graphify may be measured

from graphify.runtime.captured_step import CapturedGraph, CapturedStep, modes_changed  # noqa: E402
from graphify.runtime.common import changed_in_place, leaves, tree_map, versions  # noqa: E402
from graphify.runtime.gradients import GradientWatch  # noqa: E402
from graphify.runtime.optimizer_settings import use_tensor_lrs  # noqa: E402
from graphify.runtime.states import Phase, registry  # noqa: E402

CALLS = 2000  # a block; the periodic host-value rechecks (replays 128, 256, ...) fall in few blocks
BATCHES = 8


class NoGraph:
    """A captured graph whose replay costs nothing: what is left is the host's work around it."""

    def replay(self) -> None:
        pass

    def pool(self):
        return None


class CpuStep(CapturedStep):
    """A CapturedStep that takes the CPU for CUDA: eager calls run the step; a capture runs it once under
    the watch a real capture uses and keeps a NoGraph."""

    def _on_cuda(self, tensors) -> bool:
        return all(t.is_cpu for t in tensors)  # as the real test, on the other device

    def _eager(self, tensors, inputs, timed=False, recorded=False):
        return self.step(*inputs)

    def _record_graph(self, key, device, inputs):
        state = self.state
        static_inputs = tree_map(torch.Tensor.clone, inputs)
        statics = leaves(static_inputs)
        before = versions(statics)
        trained = dict.fromkeys([*state.parameters, *(p for o in state.optimizers for g in o.param_groups for p in g["params"])])
        watch = GradientWatch(trained)
        swapped = use_tensor_lrs(state.optimizers, state.lr_tensors, state.frozen, state.group_counts)
        try:
            outputs = self.step(*static_inputs)
        finally:
            watch.close()
            for group, lr in swapped:
                group["lr"] = lr
        modes_set = modes_changed(state.submodules, key[3][0])
        return CapturedGraph(NoGraph(), statics, outputs, watch.gradients(), changed_in_place(statics, before), modes_set), None


def tiny():
    """bench/workloads/tiny.py's model, optimizer and batches, on the CPU."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    batches = [(torch.randn(8, 64), torch.randint(0, 10, (8,))) for _ in range(BATCHES)]
    return model, torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss(), batches


def wide():
    """Many modules and parameters, few FLOPs: 75 x (Linear, LayerNorm, ReLU) under AdamW."""
    torch.manual_seed(0)
    model = nn.Sequential(*(layer for _ in range(75) for layer in (nn.Linear(16, 16), nn.LayerNorm(16), nn.ReLU())))
    batches = [(torch.randn(8, 16), torch.randn(8, 16)) for _ in range(BATCHES)]
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), nn.MSELoss(), batches


MODELS = {"tiny": tiny, "wide": wide}


def captured(model_name: str):
    """(a CpuStep of the model's training step, CAPTURED, its batches)."""
    model, optimizer, loss_fn, batches = MODELS[model_name]()

    def train_step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()

    model.train()
    step = CpuStep(train_step)
    # no GPU-bound decision, no loop trial: the state after them; no host-value record, as on the CPU
    # every tensor the step reads is a host value (the replays are checked at their usual counts all the same)
    os.environ.update(GRAPHIFY_CAPTURE="always", GRAPHIFY_HOST_CHECK="off")
    try:
        for i in range(8):
            step(*batches[i % BATCHES])
    finally:
        del os.environ["GRAPHIFY_CAPTURE"], os.environ["GRAPHIFY_HOST_CHECK"]
    step.state.recorded = True
    (key,) = step.state.keys
    assert step.state.phase(key, step._warmup()) is Phase.CAPTURED and step.state.disabled is None
    return step, batches


def by_hand(graph: CapturedGraph):
    """The hand-written replay loop's call: copy the inputs in, replay."""
    statics, replay = graph.statics, graph.graph.replay

    def call(x, y):
        statics[0].copy_(x, non_blocking=True)
        statics[1].copy_(y, non_blocking=True)
        replay()

    return call


def per_call_us(call, batches, calls: int = CALLS) -> float:
    start = time.perf_counter()
    for i in range(calls):
        call(*batches[i & (BATCHES - 1)])
    return (time.perf_counter() - start) / calls * 1e6


def measure(model_name: str, repeats: int) -> dict:
    """Median and spread (µs a call) of graphify's replayed calls and the hand-written ones, in turns."""
    step, batches = captured(model_name)
    hand = by_hand(next(iter(step.state.graphs.values())))
    times: dict = {"graphify": [], "hand": []}
    for _ in range(repeats):
        times["graphify"].append(per_call_us(step, batches))
        times["hand"].append(per_call_us(hand, batches))
    assert not step.state.disabled and step.state.recaptures == 0, "the replays must not have dropped the graph"
    state = step.state
    return {
        "model": f"{model_name} ({len(state.submodules)} modules, {len(state.parameters)} parameters)",
        **{name: (statistics.median(t), min(t), max(t)) for name, t in times.items()},
        "overhead": statistics.median(g - h for g, h in zip(times["graphify"], times["hand"])),
    }


def profile(model_name: str) -> None:
    step, batches = captured(model_name)
    profiler = cProfile.Profile()
    profiler.enable()
    per_call_us(step, batches, 20000)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated; known: {', '.join(MODELS)}")
    parser.add_argument("--repeats", type=int, default=15, help="alternating blocks of each")
    parser.add_argument("--profile", metavar="MODEL", choices=MODELS, help="profile the replayed calls of one model instead")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)  # AdamW's capturable flag on the CPU
    if args.profile:
        profile(args.profile)
        return 0
    for name in args.models.split(","):
        registry.reset()
        r = measure(name, args.repeats)
        g, h = r["graphify"], r["hand"]
        print(
            f"{r['model']}: graphify {g[0]:.2f} µs a call ({g[1]:.2f}-{g[2]:.2f}), by hand {h[0]:.2f} ({h[1]:.2f}-{h[2]:.2f}); "
            f"graphify's own {r['overhead']:.2f} µs a call"
        )
    return 0


def allow_capturable_on_cpu() -> None:
    """AdamW captures with `capturable=True`, which its eager step refuses off the GPU; the bench's capture
    is an eager step on the CPU."""
    adam = importlib.import_module("torch.optim.adam")
    supported = adam._get_capturable_supported_devices
    adam._get_capturable_supported_devices = lambda *a, **k: [*supported(*a, **k), "cpu"]


if __name__ == "__main__":
    allow_capturable_on_cpu()
    sys.exit(main())
