"""GraphedModule on a GPU decides once whether graphs pay: a GPU-bound forward is never captured, graphs
whose replays are not clearly faster than eager passes are dropped, and the training then runs bit for
bit as plain eager (the timed passes leave no trace); GRAPHIFY_CAPTURE=always keeps the graphs."""

from __future__ import annotations

import pytest
import torch
from harness import assert_all_close, fallbacks, no_fallback, snapshot

from graphify.runtime import GraphedModule
from graphify.runtime import graphed_module as graphed_module_runtime


def _tiny():
    return torch.nn.Linear(8, 4)


def _normalised():
    """Batch norm and dropout: what the timed passes change (running statistics, the CUDA RNG) shows."""
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 4)
    )


def _train(make_model, graphed: bool, steps=10, width=8, batch=16):
    """(losses, parameters and buffers, CUDA RNG state, the GraphedModule or None, fallback messages)."""
    torch.manual_seed(0)
    model = make_model().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(batch, width, generator=g).cuda(), torch.randn(batch, 4, generator=g).cuda()) for _ in range(steps)]
    call = GraphedModule(model) if graphed else model
    losses = []
    with fallbacks() as messages:
        for x, y in batches:
            opt.zero_grad()
            out = call(x)
            loss = torch.nn.functional.mse_loss(out[:, :4], y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    state = snapshot([*model.parameters(), *model.buffers()])
    return losses, state, torch.cuda.get_rng_state(), call if graphed else None, messages


def _assert_bit_identical(got, expected):
    for a, b in zip(got[0] + got[1], expected[0] + expected[1], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(got[2], expected[2])  # the CUDA RNG: the timed passes' draws were undone


def test_dropped_graphs_leave_no_trace_in_batch_norm_or_the_rng(timings_say, captures):
    """Graphs timed and dropped (a gain no replay can reach): the capture's and the timed passes'
    batch-norm updates and dropout draws are undone, and training matches plain eager bit for bit."""
    timings_say(passes_pay=False)
    expected = _train(_normalised, graphed=False)
    got = _train(_normalised, graphed=True)
    assert captures == [1, 1]  # the forward and backward graphs were captured, then dropped
    graphed, messages = got[3], got[4]
    assert graphed.state["graphed"] is None
    assert len(messages) == 1 and "no gain expected: a replayed forward and backward took " in messages[0], messages
    _assert_bit_identical(got, expected)


def test_dropped_graphs_leave_no_cuda_tensor_to_a_forked_worker(timings_say):
    """Dropped graphs hold their static tensors in reference cycles. A DataLoader worker forked while they
    wait for a collection would free them, and a fork cannot touch CUDA: it aborts. They are collected
    right before a fork (common.free_dropped_graphs), not at once: a full collection costs more than a
    short loop gains."""
    import gc
    import os

    timings_say(passes_pay=False)
    gc.collect()
    gc.disable()
    try:
        got = _train(_normalised, graphed=True)
        assert got[3].state["graphed"] is None
        pid = os.fork()
        if pid == 0:
            os._exit(0)  # the worker: it only has to be forked
        os.waitpid(pid, 0)
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection now would free stays in gc.garbage
        gc.collect()
        left = [o for o in gc.garbage if torch.is_tensor(o) and o.is_cuda]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not left, f"{len(left)} CUDA tensors were still waiting for the garbage collector at the fork"


def test_a_gpu_bound_forward_is_never_captured(captures):
    """Big matmuls keep the GPU busy far longer than their launch: the last warmup call tells, no capture."""
    expected = _train(lambda: torch.nn.Linear(4096, 4096), graphed=False, steps=5, width=4096, batch=4096)
    got = _train(lambda: torch.nn.Linear(4096, 4096), graphed=True, steps=5, width=4096, batch=4096)
    graphed, messages = got[3], got[4]
    assert captures == [] and graphed.state["graphed"] is None
    assert len(messages) == 1 and "no gain expected: GPU-bound (its forward pass keeps the GPU busy " in messages[0], messages
    assert_all_close(got[0] + got[1], expected[0] + expected[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("make_model", [_tiny, _normalised], ids=["tiny", "batch-norm-dropout"])
def test_graphify_capture_always_keeps_the_graphs(always_capture, monkeypatch, replays, make_model):
    monkeypatch.setattr(graphed_module_runtime, "TIMED_PASSES", None)  # never consulted: no timing runs
    expected = _train(make_model, graphed=False)
    got = _train(make_model, graphed=True)
    graphed, messages = got[3], got[4]
    assert messages == [] and graphed.state["graphed"] is not None and graphed.state["disabled"] is None
    assert len(replays) == 2 * (10 - 4)  # a forward and a backward graph for every call after the warmup (3 + 1 recorded)
    assert_all_close(got[0] + got[1], expected[0] + expected[1])


class _Task(torch.nn.Module):
    """A model and its loss in one module returning a dict, as timm's training tasks do."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

    def forward(self, x, target):
        output = self.model(x)
        return {"loss": torch.nn.functional.mse_loss(output, target), "output": output}


def _train_chain(graphed: bool, steps=12):
    """An encoder whose output feeds a head and a decoder, a task module returning a dict, and a frozen
    module: each graphed on its own when `graphed`. (losses, parameters, replays per module)."""
    torch.manual_seed(0)
    encoder, head, decoder, task = torch.nn.Linear(8, 8).cuda(), torch.nn.Linear(8, 4).cuda(), torch.nn.Linear(8, 8).cuda(), _Task().cuda()
    frozen = torch.nn.Linear(8, 8).cuda().requires_grad_(False)
    modules = [encoder, head, decoder, task, frozen]
    opt = torch.optim.SGD([p for m in modules for p in m.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    calls = [GraphedModule(m) if graphed else m for m in modules]
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(16, 8, generator=g).cuda(), torch.randn(16, 4, generator=g).cuda()
        opt.zero_grad()
        code = calls[0](calls[4](x))
        result = calls[3](code, y)
        loss = result["loss"] + torch.nn.functional.mse_loss(calls[1](code), y) + 0.5 * torch.nn.functional.mse_loss(calls[2](code), x)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, snapshot(p for m in modules for p in m.parameters()), calls


def test_chained_modules_a_dict_output_and_a_frozen_module(always_capture):
    """Graphed modules feeding one another: the encoder's replayed backward takes the summed gradient of
    the three modules reading its output; a module returning a dict replays; a module with nothing to
    differentiate is never captured, and says nothing."""
    expected = _train_chain(graphed=False)
    with no_fallback():
        got = _train_chain(graphed=True)
    encoder, head, decoder, task, frozen = got[2]
    assert all(m.state["graphed"] is not None for m in (encoder, head, decoder, task))
    assert frozen.state["graphed"] is None and frozen.state["disabled"] is None and not frozen.state["warmup_runs"]
    assert_all_close(got[0] + got[1], expected[0] + expected[1])


class _Tied(torch.nn.Module):
    """Weights tied between two layers and a frozen layer: what capturing on parameter aliases must keep."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(4, 4)
        self.frozen = torch.nn.Linear(4, 4).requires_grad_(False)
        self.out = torch.nn.Linear(4, 4)
        self.out.weight = self.inp.weight

    def forward(self, x):
        return self.out(torch.relu(self.frozen(self.inp(x))))


def _train_acting(graphed: bool, steps=12):
    """DQN's shape: each step picks an action from the model with grad on, keeps its output (an autograd
    graph made on the default stream) alive through the update, then trains on a batch."""
    torch.manual_seed(0)
    model = _Tied().cuda()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    call = GraphedModule(model) if graphed else model
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        q_values = model(torch.randn(1, 4, generator=g).cuda())
        action = int(q_values.argmax().item())
        x, y = torch.randn(64, 4, generator=g).cuda(), torch.randn(64, 1, generator=g).cuda()
        loss = torch.nn.functional.mse_loss(call(x)[:, action : action + 1], y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, snapshot(model.parameters()), call


def test_a_model_graph_kept_alive_by_eager_code_does_not_stop_the_capture(always_capture):
    """The eager action pick keeps the parameters' gradient accumulators alive on the default stream; a
    backward captured on them would wait on that stream and fail. Captured on aliases of the parameters,
    the graphs replay, and tied and frozen weights train as eagerly."""
    expected = _train_acting(graphed=False)
    with no_fallback():
        got = _train_acting(graphed=True)
    assert got[2].state["graphed"] is not None and got[2].state["disabled"] is None
    assert_all_close(got[0] + got[1], expected[0] + expected[1])


def _train_lengths(lengths, graphed: bool):
    """A recurrent model fed one batch per length in `lengths` (sequences padded per batch)."""
    torch.manual_seed(0)
    model = torch.nn.GRU(4, 8, batch_first=True).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    call = GraphedModule(model) if graphed else model
    g = torch.Generator().manual_seed(1)
    losses = []
    with fallbacks() as messages:
        for length in lengths:
            output, _ = call(torch.randn(16, length, 4, generator=g).cuda())
            loss = output.square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    return losses, snapshot(model.parameters()), call, messages


def test_inputs_padded_per_batch_leave_the_model_eager_without_a_capture(always_capture, captures):
    """Every batch its own length: no shape is warmed up before MAX_SIGNATURES of them, so nothing is
    captured, one warning says why, and training is plain eager."""
    lengths = [5, 9, 5, 7, 12, 9, 6, 5, 11, 8, 13, 10, 7]  # length 5 comes 3 times only
    expected = _train_lengths(lengths, graphed=False)
    got = _train_lengths(lengths, graphed=True)
    assert captures == [] and got[2].state["graphed"] is None
    assert len(got[3]) == 1 and "inputs came in more than 8 shapes" in got[3][0], got[3]
    assert_all_close(got[0] + got[1], expected[0] + expected[1])


def test_the_graph_is_recorded_for_the_shape_that_recurs(always_capture):
    """A short batch first, then full ones with a stray shape between: the full shape is captured (after
    its own warmup) and replays; the others run eagerly."""
    lengths = [3, 6, 6, 4, 6, 6, 6, 6, 4, 6]
    expected = _train_lengths(lengths, graphed=False)
    got = _train_lengths(lengths, graphed=True)
    graphed = got[2].state["graphed"]
    assert got[3] == [] and graphed is not None
    assert got[2].state["signature"][0][0][0] == torch.Size([16, 6, 4])
    assert_all_close(got[0] + got[1], expected[0] + expected[1])
