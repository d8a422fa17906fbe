"""What the CUDA tests build their training loops from: a seeded small model, batches drawn on the host, the
plain training step, a loop that runs a wrapped step and records the runtime's fallback warnings, and the
comparison of a wrapped run with the eager one. Most tests train twice, once with `eager` (no wrapper) and
once with CapturedStep or GraphedModule, and compare what they left.

(A module of its own, not conftest.py: with a conftest.py in tests/ as well, `from conftest import` would
not say which one.)"""

from __future__ import annotations

import contextlib
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from graphify.runtime import GraphifyFallbackWarning

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench.workloads
    sys.path.insert(0, str(REPO))


def eager(fn):
    """The reference run's wrapper: the step function or model as it is."""
    return fn


def small_model() -> torch.nn.Sequential:
    """The seeded MLP most tests train: 16 features, 64 hidden, 1 output."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()


def batches(count: int, size: int = 32, width: int = 16, targets: int = 1, seed: int = 1):
    """`count` (x, y) batches drawn on the host from a generator of their own (the CUDA generator, which
    dropout draws from, is left alone) and moved to the GPU one at a time, as a loader's would be."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        yield torch.randn(size, width, generator=g).cuda(), torch.randn(size, targets, generator=g).cuda()


def mse_step(model, optimizer):
    """The plain training step: zero the gradients, an MSE loss, its backward, the optimizer's step."""

    def train_step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return train_step


@contextlib.contextmanager
def fallbacks():
    """The messages of the GraphifyFallbackWarnings raised inside, every one (no filter dedupes them): the
    list it gives is filled when the block ends."""
    messages = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield messages
    messages.extend(str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning))


@contextlib.contextmanager
def no_fallback():
    """A GraphifyFallbackWarning raised inside fails the test where it is raised."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphifyFallbackWarning)
        yield


def snapshot(tensors) -> list[torch.Tensor]:
    """Copies of the tensors (parameters, buffers) once the GPU has finished its work on them."""
    torch.cuda.synchronize()
    return [t.detach().clone() for t in tensors]


@dataclass
class Run:
    params: list[torch.Tensor]  # the model's parameters after the loop
    step: object  # the wrapped step (the step function itself in the eager run)
    messages: list[str]  # the runtime's fallback warnings


def train(wrap, model, optimizer, data, step=None, before=None) -> Run:
    """The small training loop: `wrap(step)` (mse_step by default) called on every (x, y) of `data`, with
    `before(i)` (the loop's own code: a schedule, a pruning) before the i-th call, counted from 0."""
    step = wrap(step or mse_step(model, optimizer))
    with fallbacks() as messages:
        for i, (x, y) in enumerate(data):
            if before is not None:
                before(i)
            step(x, y)
    return Run(snapshot(model.parameters()), step, messages)


def assert_all_close(got, expected, rtol=1e-5, atol=1e-6) -> None:
    """A wrapped run against the eager one, tensor by tensor (their numbers must match). By default eager
    and replayed kernels may round apart in the last bits; tests that expect more or less say so."""
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


class Schedule:
    """A loss weight read through a property: a host value that moves when the loop sets `t`, through a
    channel the step's source does not show."""

    def __init__(self):
        self.t = 0

    @property
    def weight(self):
        return 1.0 + self.t / 50


STEPS = 30  # of a bench workload


def train_workload(module, fn: str = "train", capturable: bool = False, **kwargs):
    """A bench workload (bench/workloads) built on the GPU and trained STEPS steps by its `fn` (`train`, the
    eager loop; `train_hand`, its hand-written capture; `train` of a rewritten module). `capturable`: its
    optimizer runs eagerly the arithmetic a capture uses (on the GPU, in float32). (the model's floating-point
    state, the optimizer's learning rates at the end)"""
    w = module.build("cuda")
    if capturable:
        for group in w["optimizer"].param_groups:
            if "capturable" in group:
                group["capturable"] = True
    getattr(module, fn)(w["model"], w["optimizer"], w["scheduler"], w["loss_fn"], w["batches"], STEPS, **kwargs)
    torch.cuda.synchronize()
    state = {k: v.detach().clone() for k, v in w["model"].state_dict().items() if v.is_floating_point()}
    return state, [float(g["lr"]) for g in w["optimizer"].param_groups]
