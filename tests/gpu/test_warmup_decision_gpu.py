"""The decision before a first capture, on a GPU (runtime/common.py WarmupLoad): work that keeps the GPU busy
far longer than the host takes to launch it is left eager from its warmup calls' timings, before any
capture (none is recorded), with one warning; launch-bound work is captured at the same call as before;
timings are read once the GPU has run them, so the warmup adds no synchronisation but one wait at the
first decision. Also: a graphed model called with a non-tensor input warns once and trains as eager.
Best run on an otherwise idle GPU: another process's kernels stretch the GPU's clock of these calls."""

from __future__ import annotations

import warnings

import torch

from graphify.runtime import CapturedStep, GraphedModule, GraphifyFallbackWarning
from graphify.runtime.common import LOAD_CALLS, Timing, WarmupLoad

SIZE = 4096  # fp32 matmuls of this size: about a millisecond each on an H100, launched in microseconds


def _counting_waits(monkeypatch) -> list:
    waits = []
    synchronize = torch.cuda.Event.synchronize
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: (waits.append(1), synchronize(self))[1])
    return waits


def _matmul_step(size):
    """A step of big matmuls (GPU-bound) on weights of its own; returns (step function, weight)."""
    torch.manual_seed(0)
    weight = torch.randn(size, size, device="cuda", requires_grad=True)
    opt = torch.optim.SGD([weight], lr=1e-6)

    def train_step(x):
        loss = (x @ weight @ weight).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss

    return train_step, weight


def _mlp_step():
    """A small step of many tiny kernels (launch-bound): the GPU waits on each launch."""
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step(x):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    return train_step, model


def _calls(wrapped, x, calls: int) -> list[str]:
    """The fallback messages of `calls` calls."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(calls):
            wrapped(x)
    torch.cuda.synchronize()
    return [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]


def test_a_gpu_bound_step_is_left_eager_at_its_first_capture_call_without_capturing(monkeypatch, captures):
    """Warmup 3 and one call more recorded: calls 2 and 3 (recorded: the recorder's host time is small beside
    the matmuls) and 4 are timed, all GPU-bound, so the 5th call decides: eager, no capture, one warning."""
    monkeypatch.delenv("GRAPHIFY_CAPTURE", raising=False)
    monkeypatch.delenv("GRAPHIFY_HOST_CHECK", raising=False)
    train_step, weight = _matmul_step(SIZE)
    step = CapturedStep(train_step)
    x = torch.randn(SIZE, SIZE, device="cuda")
    assert _calls(step, x, 4) == [] and step.state.disabled is None  # warming up
    messages = _calls(step, x, 1)
    assert len(messages) == 1 and "no gain expected: GPU-bound (a step keeps the GPU busy" in messages[0], messages
    assert "medians of 3 warmup calls" in messages[0]
    assert step.state.disabled is not None and step.state.load is None and captures == []
    assert _calls(step, x, 3) == [] and captures == [] and not step.state.graphs  # eager for good, silently
    expected_step, expected_weight = _matmul_step(SIZE)
    for _ in range(8):
        expected_step(x)
    torch.cuda.synchronize()
    torch.testing.assert_close(weight, expected_weight, rtol=1e-4, atol=1e-5)


def test_without_the_recorded_calls_a_gpu_bound_step_is_timed_more_and_waits_at_most_twice(monkeypatch, captures):
    """GRAPHIFY_HOST_CHECK=off: warmup 3, calls 2 and 3 timed, too few: the capture calls run eagerly, timed,
    until 3 timed calls the GPU has run are read (no wait) or LOAD_CALLS were timed (one wait more)."""
    monkeypatch.delenv("GRAPHIFY_CAPTURE", raising=False)
    monkeypatch.setenv("GRAPHIFY_HOST_CHECK", "off")
    waits = _counting_waits(monkeypatch)
    train_step, _ = _matmul_step(SIZE)
    step = CapturedStep(train_step)
    x = torch.randn(SIZE, SIZE, device="cuda")
    messages = _calls(step, x, 1 + LOAD_CALLS + 2)
    assert len(messages) == 1 and "no gain expected: GPU-bound" in messages[0], messages
    assert captures == [] and step.state.disabled is not None
    assert 1 <= len(waits) <= 2, waits  # the first decision's wait; one more only once LOAD_CALLS were timed


def test_a_launch_bound_step_is_captured_at_the_same_call_as_before(monkeypatch, captures):
    """The TIMED call (the 4th), run without the recorder, is not GPU-bound: the 5th call captures."""
    monkeypatch.delenv("GRAPHIFY_CAPTURE", raising=False)
    monkeypatch.delenv("GRAPHIFY_HOST_CHECK", raising=False)
    train_step, _ = _mlp_step()
    step = CapturedStep(train_step)
    x = torch.randn(64, 32, device="cuda")
    assert _calls(step, x, 4) == [] and captures == []
    assert _calls(step, x, 1) == [] and captures == [1], "launch-bound: captured at the first CAPTURE call"
    assert step.state.load is None and step.state.disabled is None and step.state.graphs


def test_a_gpu_bound_model_is_left_eager_without_capturing_and_trains_as_eager(monkeypatch, captures):
    monkeypatch.delenv("GRAPHIFY_CAPTURE", raising=False)
    monkeypatch.delenv("GRAPHIFY_HOST_CHECK", raising=False)

    def train(graphed: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(SIZE, SIZE), torch.nn.ReLU(), torch.nn.Linear(SIZE, SIZE)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        call = GraphedModule(model) if graphed else model
        g = torch.Generator().manual_seed(1)
        batches = [torch.randn(SIZE, SIZE, generator=g).cuda() for _ in range(8)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for x in batches:
                opt.zero_grad()
                call(x).square().mean().backward()
                opt.step()
        torch.cuda.synchronize()
        messages = [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]
        return [p.detach().clone() for p in model.parameters()], call, messages

    expected, _, _ = train(graphed=False)
    got, graphed, messages = train(graphed=True)
    assert len(messages) == 1 and "no gain expected: GPU-bound (its forward pass keeps the GPU busy" in messages[0], messages
    assert captures == [] and graphed.state["graphed"] is None
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_timing_is_read_once_the_gpu_ran_it_without_waiting():
    load = WarmupLoad()
    stream = torch.cuda.Stream()
    a = torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        timing = Timing(stream)
        for _ in range(4):
            a @ a  # tens of milliseconds of GPU work, launched in microseconds
        timing.stop()
    load.add(timing)
    load.read(wait=False)
    assert load.samples == [] and len(load.pending) == 1  # the GPU is still at it: not read, not waited for
    stream.synchronize()
    load.read(wait=False)
    assert len(load.samples) == 1 and not load.pending
    gpu_ms, host_ms, recorded = load.samples[0]
    assert gpu_ms > 2 * host_ms and not recorded, load.samples


def test_a_model_called_with_a_non_tensor_input_warns_once_and_trains_as_eager(monkeypatch):
    monkeypatch.setenv("GRAPHIFY_CAPTURE", "always")

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 4)

        def forward(self, x, scale=None):
            return self.linear(x) * (1.0 if scale is None else scale)

    def train(graphed: bool):
        torch.manual_seed(0)
        model = Scaled().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        call = GraphedModule(model) if graphed else model
        x = torch.randn(16, 8, device="cuda")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(6):
                opt.zero_grad()
                call(x, None).square().mean().backward()
                opt.step()
        torch.cuda.synchronize()
        messages = [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]
        return [p.detach().clone() for p in model.parameters()], call, messages

    expected, _, _ = train(graphed=False)
    got, graphed, messages = train(graphed=True)
    assert messages == [
        "graphify: the model runs eagerly: its positional input 2 is None, which a graph cannot take (its inputs are "
        "tensors, passed by position; plain values passed by keyword are part of its key): calls like it run eagerly"
    ]
    assert graphed.state["graphed"] is None and graphed.state.disabled is None
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
