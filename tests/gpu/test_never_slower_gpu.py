"""Never slower than eager, on a GPU: after a capture, replayed and eager calls run in turns in the loop
(runtime/common.py LoopTrial) and the graphs stay only where replays were clearly faster. For a whole step, an
inference step and a graphed model beside a NaN guard; what the trial decides follows its timings (here forced
either way through MIN_LOOP_GAIN), and training goes on exactly as eager either way.
bench/never_slower/run.py measures the three forms side by side with eager."""

from __future__ import annotations

import math

import pytest
import torch
from harness import assert_all_close, batches, eager, fallbacks, small_model, snapshot, train

from graphify.runtime import CapturedStep, GraphedModule
from graphify.runtime.common import TRIAL_BLOCK, TRIAL_BLOCKS

CALLS = 3 + 1 + 1 + TRIAL_BLOCK * TRIAL_BLOCKS + 12  # warmup (3 + 1 recorded), capture, the trial, then replays or eager calls


def _setup():
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt, list(batches(CALLS))


def _train(wrap):
    """Parameters after CALLS steps of `wrap(step function)`, and the wrapper and fallback messages."""
    return train(wrap, *_setup())


def test_replays_faster_in_the_loop_keep_their_graphs():
    """A small step: a replay launches one graph where eager launches each kernel."""
    expected = _train(eager).params
    got = _train(CapturedStep)
    state = got.step.state
    assert got.messages == [] and state.graphs and state.trial is None, got.messages
    eager_ms, replay_ms = state.trial_costs
    assert 0 < replay_ms < eager_ms < math.inf, state.trial_costs
    assert_all_close(got.params, expected)


def test_replays_not_faster_leave_the_step_eager_with_one_warning(timings_say):
    timings_say(loop_pays=False)
    expected = _train(eager).params
    got = _train(CapturedStep)
    messages = got.messages
    assert len(messages) == 1 and "train_step` runs eagerly: no gain expected: measured in its loop, a step took" in messages[0], messages
    assert got.step.state.graphs == {} and got.step.state.disabled.startswith("no gain expected")
    assert_all_close(got.params, expected)


def test_capture_forced_keeps_the_graphs_without_a_trial(timings_say, always_capture):
    timings_say(loop_pays=False)
    got = _train(CapturedStep)
    assert got.messages == [] and got.step.state.graphs and not got.step.state.tried, got.messages


@pytest.mark.parametrize("pays", [True, False])
def test_an_evaluation_step_is_tried_as_a_training_step(timings_say, pays):
    timings_say(loop_pays=pays)
    model, _, batches = _setup()
    model.eval()

    def inference_step(x):
        return model(x)

    step = CapturedStep(inference_step)
    with fallbacks() as messages, torch.no_grad():
        for x, _ in batches:
            torch.testing.assert_close(CapturedStep.copy(step(x)), model(x), rtol=1e-6, atol=1e-6)
    assert bool(step.state.graphs) == pays and len(messages) == (0 if pays else 1), messages


@pytest.mark.parametrize("pays", [True, False])
def test_a_model_graphed_beside_a_nan_guard_is_tried_in_its_loop(timings_say, pays):
    """The model's forward and backward graphed, the loss read on the host every step (a NaN guard)."""
    timings_say(passes_pay=True, loop_pays=pays)  # the side-by-side passes keep the graphs: the trial decides

    def train_guarded(graphed):
        model, opt, batches = _setup()
        call = GraphedModule(model) if graphed else model
        with fallbacks() as messages:
            for x, y in batches:
                loss = torch.nn.functional.mse_loss(call(x), y)
                if torch.isnan(loss):
                    continue
                opt.zero_grad()
                loss.backward()
                opt.step()
        return snapshot(model.parameters()), call, messages

    expected, _, _ = train_guarded(False)
    got, graphed, messages = train_guarded(True)
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
    assert_all_close(got, expected)
