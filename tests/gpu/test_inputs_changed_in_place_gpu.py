"""A forward that changes its input in place (normalising a batch with `sub_`), on a GPU: a replay works
on a static copy of the input, so the caller's tensor would keep its old values where the original
changed them, and code after the step that reads it (an accuracy, a running sum) would differ. A captured
step copies such inputs back after each replay; a graphed model stays eager."""

from __future__ import annotations

import pytest
import torch
from harness import assert_all_close, batches, eager, fallbacks, mse_step, snapshot

from graphify.runtime import CapturedStep, GraphedModule


class _Centering(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def forward(self, x):
        x.sub_(x.mean(0))  # the caller's batch is centred too
        return self.net(x)


def _train(wrap_step=eager, wrap_model=eager, steps=30):
    """(parameters, what the loop read from each batch after its step, fallback messages, the wrapper)."""
    torch.manual_seed(0)
    model = _Centering().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    call = wrap_model(model)
    step = wrap_step(mse_step(call, optimizer))
    read = []
    with fallbacks() as messages:
        for x, y in batches(steps):
            x = x + 3  # off centre
            step(x, y)
            read.append(x.abs().sum().item())  # after the step: the centred batch
    return snapshot(model.parameters()), read, messages, step if wrap_step is not eager else call


def test_a_captured_step_hands_back_the_inputs_it_changed_in_place(always_capture):
    expected, expected_read, _, _ = _train()
    got, read, messages, step = _train(wrap_step=CapturedStep)
    (captured,) = step.state.graphs.values()
    assert messages == [] and captured.changed == (0,), messages  # the batch, not the targets
    assert read == pytest.approx(expected_read, rel=1e-5)
    assert_all_close(got, expected)


def test_a_graphed_model_that_changes_its_input_in_place_stays_eager(always_capture):
    expected, expected_read, _, _ = _train()
    got, read, messages, call = _train(wrap_model=GraphedModule)
    assert len(messages) == 1 and "changes an input in place" in messages[0], messages
    assert call.state["graphed"] is None and call.state["disabled"] is not None
    assert read == pytest.approx(expected_read, rel=1e-5)
    assert_all_close(got, expected)
