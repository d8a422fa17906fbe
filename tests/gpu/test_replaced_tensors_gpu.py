"""Tensors replaced between loop entries, on a GPU: a graph reads and writes the addresses it was captured
with. Restoring the best epoch's optimizer state with `load_state_dict` makes new state tensors (a graph
kept from before would go on updating the old ones, and the optimizer would read moments it never
updated), and swapping a submodule leaves a graphed model on the old layer's weights. The runtime compares
the addresses when the loop is entered again (and at its later checks)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from graphify.runtime import CapturedStep, GraphedModule, GraphifyFallbackWarning
from test_runtime_gpu import _mse_step

pytestmark = pytest.mark.cuda


def _model():
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()


def _train_with_restore(wrap, epochs=4, steps=30):
    """A train() per epoch; after epoch 2 the model and the optimizer go back to epoch 1's checkpoint."""
    torch.manual_seed(0)
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, capturable=True)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 16, generator=g).cuda(), torch.randn(32, 1, generator=g).cuda()) for _ in range(steps)]

    def train():
        step = wrap(_mse_step(model, optimizer))
        for x, y in batches:
            step(x, y)
        return step

    best = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(epochs):
            step = train()
            if epoch == 0:
                best = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
            if epoch == 1:
                model.load_state_dict(best[0])  # copied into the parameters in place
                optimizer.load_state_dict(best[1])  # new state tensors
    torch.cuda.synchronize()
    messages = [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]
    return [p.detach().clone() for p in model.parameters()], step, messages


def test_optimizer_state_restored_from_a_checkpoint_is_captured_again(always_capture):
    expected = _train_with_restore(lambda f: f)[0]
    got, step, messages = _train_with_restore(CapturedStep)
    assert messages == [] and step.state.graphs and step.state.recaptures == 1, (messages, step.state.recaptures)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_graphed_model_whose_layer_was_swapped_runs_eagerly(always_capture):

    def run(graphed: bool):
        torch.manual_seed(0)
        model = _model()
        g = torch.Generator().manual_seed(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for epoch in range(3):
                if epoch == 2:
                    model[2] = torch.nn.Linear(64, 1).cuda()  # a new head for the last phase
                optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
                call = GraphedModule(model) if graphed else model
                for _ in range(20):
                    loss = call(torch.randn(32, 16, generator=g).cuda()).square().mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        torch.cuda.synchronize()
        messages = [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]
        return [p.detach().clone() for p in model.parameters()], messages

    expected, _ = run(graphed=False)
    got, messages = run(graphed=True)
    assert len(messages) == 1 and "were replaced after the capture" in messages[0], messages
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
