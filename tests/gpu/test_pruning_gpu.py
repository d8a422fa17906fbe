"""Modules whose forward changes between steps, on a GPU: gradual pruning re-parametrizes a weight (a new
mask buffer and forward pre-hook at each call), a parametrization changes a layer's class. A captured step
warms up and captures again at the next call, a graphed model runs eagerly from then on with one warning;
both train as eager code does."""

from __future__ import annotations

import torch
import torch.nn.utils.parametrize as parametrize
import torch.nn.utils.prune as prune
from harness import assert_all_close, batches, eager, fallbacks, snapshot, train

from graphify.runtime import CapturedStep, GraphedModule


class _Halved(torch.nn.Module):
    def forward(self, weight):
        return weight * 0.5


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    ).cuda()


def _change(model, i: int) -> None:
    if i in (8, 20):
        for layer in (model[0], model[2]):
            prune.l1_unstructured(layer, "weight", amount=0.2)
    if i == 30:
        parametrize.register_parametrization(model[4], "weight", _Halved())


def _whole_step(wrap, steps=40):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train(wrap, model, optimizer, batches(steps), before=lambda i: _change(model, i + 1))


def test_a_captured_step_is_captured_again_after_each_pruning_and_parametrization(always_capture):
    expected = _whole_step(eager).params
    got = _whole_step(CapturedStep)
    state = got.step.state
    assert got.messages == [] and state.graphs and state.recaptures == 3, (got.messages, state.recaptures)
    assert_all_close(got.params, expected)


def test_a_graphed_model_pruned_after_its_capture_runs_eagerly_with_one_warning(always_capture):
    def run(graphed: bool):
        model = _model()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        call = GraphedModule(model) if graphed else model
        with fallbacks() as messages:
            for i, (x, y) in enumerate(batches(29), start=1):
                _change(model, i)
                loss = torch.nn.functional.mse_loss(call(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return snapshot(model.parameters()), messages

    expected, _ = run(graphed=False)
    got, messages = run(graphed=True)
    assert len(messages) == 1 and "what a module's forward runs changed" in messages[0], messages
    assert_all_close(got, expected)
