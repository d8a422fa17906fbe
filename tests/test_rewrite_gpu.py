"""On a GPU, graphify's rewrite of each benchmark workload trains like the eager loop and really replays."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from graphify.rewrite import rewrite_source

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.workloads import SMALL_WORKLOADS, load_workload  # noqa: E402

pytestmark = pytest.mark.cuda
STEPS = 30


def _rewritten(name, tmp_path):
    path = REPO / "bench" / "workloads" / f"{name}.py"
    result = rewrite_source(path.read_text(), str(path))
    assert [o.rewritten for o in result.outcomes if o.function == "train"] == [True]
    out = tmp_path / f"{name}_graphify.py"
    out.write_text(result.code)
    spec = importlib.util.spec_from_file_location(f"{name}_graphify", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(module, fn="train"):
    w = module.build("cuda")
    getattr(module, fn)(w["model"], w["optimizer"], w["scheduler"], w["loss_fn"], w["batches"], STEPS)
    torch.cuda.synchronize()
    return {k: v.detach().clone() for k, v in w["model"].state_dict().items() if v.is_floating_point()}


@pytest.mark.parametrize("name", SMALL_WORKLOADS)
def test_rewrite_matches_eager(name, tmp_path):
    eager = _train(load_workload(name))
    rewritten_module = _rewritten(name, tmp_path)
    replays = []
    original_replay = torch.cuda.CUDAGraph.replay

    def counting_replay(self):
        replays.append(1)
        return original_replay(self)

    torch.cuda.CUDAGraph.replay = counting_replay
    try:
        graphed = _train(rewritten_module)
    finally:
        torch.cuda.CUDAGraph.replay = original_replay
    assert len(replays) == STEPS - 3, "every step after the 3 warmup steps is a replay"
    for key, ref in eager.items():
        rel = ((graphed[key] - ref).norm() / ref.norm().clamp_min(1e-12)).item()
        assert rel < 1e-4, f"{name}.{key}: relative difference {rel:.2e} after {STEPS} steps"
