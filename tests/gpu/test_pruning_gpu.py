"""Modules whose forward changes between steps, on a GPU: gradual pruning re-parametrizes a weight (a new
mask buffer and forward pre-hook at each call), a parametrization changes a layer's class. A captured step
warms up and captures again at the next call, a graphed model runs eagerly from then on with one warning;
both train as eager code does."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.utils.parametrize as parametrize
import torch.nn.utils.prune as prune

from graphify.runtime import CapturedStep, GraphedModule, GraphifyFallbackWarning

pytestmark = pytest.mark.cuda


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

    def train_step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    step = wrap(train_step)
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(1, steps + 1):
            _change(model, i)
            step(torch.randn(32, 16, generator=g).cuda(), torch.randn(32, 1, generator=g).cuda())
    torch.cuda.synchronize()
    messages = [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]
    return [p.detach().clone() for p in model.parameters()], step, messages


def test_a_captured_step_is_captured_again_after_each_pruning_and_parametrization(always_capture):
    expected = _whole_step(lambda f: f)[0]
    got, step, messages = _whole_step(CapturedStep)
    assert messages == [] and step.state.graphs and step.state.recaptures == 3, (messages, step.state.recaptures)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_graphed_model_pruned_after_its_capture_runs_eagerly_with_one_warning(always_capture):
    def run(graphed: bool):
        model = _model()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        call = GraphedModule(model) if graphed else model
        g = torch.Generator().manual_seed(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(1, 30):
                _change(model, i)
                loss = torch.nn.functional.mse_loss(call(torch.randn(32, 16, generator=g).cuda()), torch.randn(32, 1, generator=g).cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        torch.cuda.synchronize()
        messages = [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]
        return [p.detach().clone() for p in model.parameters()], messages

    expected, _ = run(graphed=False)
    got, messages = run(graphed=True)
    assert len(messages) == 1 and "what a module's forward runs changed" in messages[0], messages
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
