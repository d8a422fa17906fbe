"""Never slower than eager, on a GPU: after a capture, replayed and eager calls run in turns in the loop
(runtime/common.py LoopTrial) and the graphs stay only where replays were clearly faster. For a whole step, an
inference step and a graphed model beside a NaN guard; what the trial decides follows its timings (here forced
either way through MIN_LOOP_GAIN), and training goes on exactly as eager either way.
bench/never_slower/run.py measures the three forms side by side with eager."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from graphify.runtime import CapturedStep, GraphedModule, GraphifyFallbackWarning, common, graphed_module
from graphify.runtime.common import TRIAL_BLOCK, TRIAL_BLOCKS

pytestmark = pytest.mark.cuda
CALLS = 3 + 1 + 1 + TRIAL_BLOCK * TRIAL_BLOCKS + 12  # warmup (3 + 1 recorded), capture, the trial, then replays or eager calls


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 16, generator=g).cuda(), torch.randn(32, 1, generator=g).cuda()) for _ in range(CALLS)]
    return model, opt, batches


def _train(wrap):
    """Parameters after CALLS steps of `wrap(step function, model)`, and the wrapper and fallback messages."""
    model, opt, batches = _setup()

    def train_step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step = wrap(train_step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in batches:
            step(x, y)
    torch.cuda.synchronize()
    messages = [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]
    return [p.detach().clone() for p in model.parameters()], step, messages


def _close(got, expected):
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_replays_faster_in_the_loop_keep_their_graphs():
    """A small step: a replay launches one graph where eager launches each kernel."""
    expected, _, _ = _train(lambda f: f)
    got, step, messages = _train(CapturedStep)
    assert messages == [] and step.state.graphs and step.state.trial is None
    eager_ms, replay_ms = step.state.trial_costs
    assert 0 < replay_ms < eager_ms < math.inf, step.state.trial_costs
    _close(got, expected)


def test_replays_not_faster_leave_the_step_eager_with_one_warning(monkeypatch):
    monkeypatch.setattr(common, "MIN_LOOP_GAIN", 1e9)
    expected, _, _ = _train(lambda f: f)
    got, step, messages = _train(CapturedStep)
    assert len(messages) == 1 and "train_step` runs eagerly: no gain expected: measured in its loop, a step took" in messages[0], messages
    assert step.state.graphs == {} and step.state.disabled.startswith("no gain expected")
    _close(got, expected)


def test_capture_forced_keeps_the_graphs_without_a_trial(monkeypatch):
    monkeypatch.setattr(common, "MIN_LOOP_GAIN", 1e9)
    monkeypatch.setenv("GRAPHIFY_CAPTURE", "always")
    _, step, messages = _train(CapturedStep)
    assert messages == [] and step.state.graphs and not step.state.tried


@pytest.mark.parametrize("pays", [True, False])
def test_an_evaluation_step_is_tried_as_a_training_step(monkeypatch, pays):
    monkeypatch.setattr(common, "MIN_LOOP_GAIN", 0.0 if pays else 1e9)
    model, _, batches = _setup()
    model.eval()

    def inference_step(x):
        return model(x)

    step = CapturedStep(inference_step)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for x, _ in batches:
            torch.testing.assert_close(CapturedStep.copy(step(x)), model(x), rtol=1e-6, atol=1e-6)
    messages = [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]
    assert bool(step.state.graphs) == pays and len(messages) == (0 if pays else 1), messages


@pytest.mark.parametrize("pays", [True, False])
def test_a_model_graphed_beside_a_nan_guard_is_tried_in_its_loop(monkeypatch, pays):
    """The model's forward and backward graphed, the loss read on the host every step (a NaN guard)."""
    monkeypatch.setattr(graphed_module, "MIN_REPLAY_GAIN", 0.0)  # the side-by-side passes keep the graphs: the trial decides
    monkeypatch.setattr(common, "MIN_LOOP_GAIN", 0.0 if pays else 1e9)

    def train(graphed):
        model, opt, batches = _setup()
        call = GraphedModule(model) if graphed else model
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for x, y in batches:
                loss = torch.nn.functional.mse_loss(call(x), y)
                if torch.isnan(loss):
                    continue
                opt.zero_grad()
                loss.backward()
                opt.step()
        torch.cuda.synchronize()
        messages = [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]
        return [p.detach().clone() for p in model.parameters()], call, messages

    expected, _, _ = train(False)
    got, graphed, messages = train(True)
    if pays:
        assert messages == [] and graphed.state["graphed"] is not None and graphed.state["trial"] is None
        eager_ms, replay_ms = graphed.state["trial_costs"]
        assert 0 < replay_ms < math.inf and 0 < eager_ms < math.inf
    else:
        assert (
            len(messages) == 1
            and "the model runs eagerly: no gain expected: measured in its loop, its forward and backward took" in messages[0]
        )
        assert graphed.state["graphed"] is None and graphed.state["disabled"] is not None
    _close(got, expected)
