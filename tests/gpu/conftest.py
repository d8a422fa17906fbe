"""The CUDA tests' fixtures. Every test in this folder is a CUDA test: it is marked `cuda` here, so that
`-m cuda` (scripts/gpu-check) selects it and tests/conftest.py skips it without a GPU. The helpers the
tests build their training loops from are in harness.py; `always_capture` (GRAPHIFY_CAPTURE=always) is in
tests/conftest.py, where the CUDA tests outside this folder find it too."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects and tests/conftest.py skips by the mark
def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.cuda)


@pytest.fixture
def timings_say(monkeypatch):
    """What the runtime concludes from its timings, forced either way: `timings_say(loop_pays=...)` for the
    trial of replayed against eager calls in the loop (common.MIN_LOOP_GAIN), `timings_say(passes_pay=...)`
    for GraphedModule's side-by-side passes after its capture (graphed_module.MIN_REPLAY_GAIN). True: any
    gain keeps the graphs; False: no gain does. Either one also keeps the warmup calls from calling the work
    GPU-bound (common.GPU_BOUND_SHARE), which a GPU shared with the other test processes can make it look:
    the decision under test comes later."""
    from graphify.runtime import common, graphed_module

    def say(*, loop_pays: bool | None = None, passes_pay: bool | None = None) -> None:
        monkeypatch.setattr(common, "GPU_BOUND_SHARE", 0.0)
        if loop_pays is not None:
            monkeypatch.setattr(common, "MIN_LOOP_GAIN", 0.0 if loop_pays else 1e9)
        if passes_pay is not None:
            monkeypatch.setattr(graphed_module, "MIN_REPLAY_GAIN", 0.0 if passes_pay else math.inf)

    return say


def _counting(monkeypatch, name: str) -> list:
    calls = []
    original = getattr(torch.cuda.CUDAGraph, name)
    monkeypatch.setattr(torch.cuda.CUDAGraph, name, lambda self, *a, **k: (calls.append(1), original(self, *a, **k))[1])
    return calls


@pytest.fixture
def captures(monkeypatch):
    """One entry per CUDA graph captured from here on (each `CUDAGraph.capture_end`)."""
    return _counting(monkeypatch, "capture_end")


@pytest.fixture
def replays(monkeypatch):
    """One entry per CUDA graph replayed from here on (each `CUDAGraph.replay`)."""
    return _counting(monkeypatch, "replay")


@pytest.fixture
def deterministic_cudnn():
    """cuDNN's default convolution backward is not bit-reproducible, even eager against eager (the `cnn`
    workload's BatchNorm biases differ by ~10% after 30 steps): deterministic algorithms, no autotuning."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


@pytest.fixture
def checks_by_count(monkeypatch):
    """Periodic checks of replays on their count alone (the 128th, 256th, ... replay), not waiting until the
    loop has run long enough for them to cost a small share (states.MAX_CHECK_SHARE): for tests that count
    recorded calls or expect the 128th replay's check, on steps whose check costs many replays."""
    from graphify.runtime import states

    monkeypatch.setattr(states, "MAX_CHECK_SHARE", math.inf)
