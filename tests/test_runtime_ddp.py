"""DistributedDataParallel steps: the rewrite builds DDP on the capture stream, and the runtime captures
a DDP step only when that is so (NCCL, no find_unused_parameters), after 11 warmup steps, with every
rank agreeing on the capture. Multi-GPU runs: scripts/ddp-check."""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from graphify.rewrite import rewrite_source
from graphify.runtime import CapturedStep, GraphifyFallbackWarning, build_on_capture_stream
from graphify.runtime.distributed import why_ddp_not_capturable

TRAP = Path(__file__).resolve().parents[1] / "fixtures" / "traps" / "ddp_trainer_init.py"


@pytest.fixture
def process_group(tmp_path):
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield backend
    if dist.is_initialized():
        dist.destroy_process_group()


def test_the_rewrite_builds_ddp_on_the_capture_stream(settings):
    code = rewrite_source(TRAP.read_text(), str(TRAP), settings).code
    assert "from graphify.runtime import CapturedStep, build_on_capture_stream\n" in code
    assert 'self.model = build_on_capture_stream(DDP, model, device_ids=[local_rank] if device.type == "cuda" else None)' in code


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_on_cpu_ddp_is_built_as_usual_and_its_step_runs_eagerly(process_group):
    model = build_on_capture_stream(torch.nn.parallel.DistributedDataParallel, torch.nn.Linear(4, 2))
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    assert "built outside graphify's capture stream" in why_ddp_not_capturable(model)
    model._graphify_built_on_capture_stream = True  # as on CUDA: then the backend decides
    assert "does not communicate through NCCL" in why_ddp_not_capturable(model)
    unused = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2), find_unused_parameters=True)
    unused._graphify_built_on_capture_stream = True
    assert "find_unused_parameters=True" in why_ddp_not_capturable(unused)


def _captured_ddp_step(device) -> CapturedStep:
    """An SGD step of a small DDP model on `device`, built as the rewrite builds it."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
    model = build_on_capture_stream(torch.nn.parallel.DistributedDataParallel, net, device_ids=[device.index])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return CapturedStep(step)


@pytest.mark.cuda
def test_a_ddp_step_is_captured_after_eleven_warmup_steps(process_group):
    device = torch.device("cuda", torch.cuda.current_device())
    captured = _captured_ddp_step(device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphifyFallbackWarning)
        for i in range(14):
            captured(torch.randn(4, 8, device=device))
            assert bool(captured.state.graphs) == (i >= 11), i


@pytest.mark.cuda
def test_a_ddp_step_switching_sync_per_micro_step_trains_as_eager_ddp(process_group):
    """The step holds an accumulation cycle: DDP all-reduces on its last micro-step only, and the graph
    replays that cycle. One rank: the hooks and all-reduces are real, nothing crosses GPUs."""
    import copy

    torch.manual_seed(0)
    device = torch.device("cuda", torch.cuda.current_device())
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2)).to(device)
    DDP = torch.nn.parallel.DistributedDataParallel
    graphed, eager = build_on_capture_stream(DDP, net, device_ids=[device.index]), DDP(copy.deepcopy(net), device_ids=[device.index])
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (graphed, eager)]

    def make_step(model, optimizer):
        def step(xs):
            optimizer.zero_grad()
            for k in range(4):
                model.require_backward_grad_sync = k == 3
                loss = model(xs[k]).square().mean() / 4
                loss.backward()
            optimizer.step()
            return loss

        return step

    captured, eager_step = CapturedStep(make_step(graphed, optimizers[0])), make_step(eager, optimizers[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphifyFallbackWarning)
        for i in range(20):
            xs = torch.randn(4, 16, 8, device=device)
            captured(xs)
            eager_step(xs)
    assert captured.state.graphs
    for a, b in zip(graphed.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU")
def test_ddp_of_a_model_off_the_current_gpu_is_built_and_captured_on_the_models_gpu(process_group):
    """A script that never calls torch.cuda.set_device: rank 1 wraps a model on cuda:1 while cuda:0 is
    current. Built on cuda:0's side stream, its first capture failed on that rank."""
    device = torch.device("cuda", 1)
    assert torch.cuda.current_device() != device.index
    captured = _captured_ddp_step(device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphifyFallbackWarning)
        for _ in range(14):
            captured(torch.randn(4, 8, device=device))
    assert captured.state.graphs


def test_graphs_holding_collectives_are_freed_before_the_process_group_is_destroyed(process_group, monkeypatch):
    """Else destroy_process_group waits for ever on the communicator a captured all-reduce holds."""
    from graphify.runtime import distributed

    monkeypatch.setattr(distributed, "_teardown_callbacks", [])
    script = types.ModuleType("user_script")  # `from torch.distributed import destroy_process_group`, bound before
    script.destroy_process_group = dist.destroy_process_group
    monkeypatch.setitem(sys.modules, "user_script", script)
    freed = []
    distributed.free_before_teardown(lambda: freed.append(dist.is_initialized()))
    assert getattr(script.destroy_process_group, "_frees_graphs", False)
    script.destroy_process_group()
    assert freed == [True] and not dist.is_initialized()  # freed first, then destroyed
