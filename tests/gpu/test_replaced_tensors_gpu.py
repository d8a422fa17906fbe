"""Tensors replaced between loop entries, on a GPU: a graph reads and writes the addresses it was captured
with. Restoring the best epoch's optimizer state with `load_state_dict` makes new state tensors (a graph
kept from before would go on updating the old ones, and the optimizer would read moments it never
updated), and swapping a submodule leaves a graphed model on the old layer's weights. The runtime compares
the addresses when the loop is entered again (and at its later checks)."""

from __future__ import annotations

import copy

import torch
from harness import assert_all_close, batches, eager, fallbacks, mse_step, small_model, snapshot

from graphify.runtime import CapturedStep, GraphedModule


def _train_with_restore(wrap, epochs=4, steps=30):
    """A train() per epoch; after epoch 2 the model and the optimizer go back to epoch 1's checkpoint."""
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, capturable=True)
    data = list(batches(steps))  # the same batches every epoch

    def train():
        step = wrap(mse_step(model, optimizer))
        for x, y in data:
            step(x, y)
        return step

    best = None
    with fallbacks() as messages:
        for epoch in range(epochs):
            step = train()
            if epoch == 0:
                best = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
            if epoch == 1:
                model.load_state_dict(best[0])  # copied into the parameters in place
                optimizer.load_state_dict(best[1])  # new state tensors
    return snapshot(model.parameters()), step, messages


def test_optimizer_state_restored_from_a_checkpoint_is_captured_again(always_capture):
    expected = _train_with_restore(eager)[0]
    got, step, messages = _train_with_restore(CapturedStep)
    assert messages == [] and step.state.graphs and step.state.recaptures == 1, (messages, step.state.recaptures)
    assert_all_close(got, expected)


def test_a_graphed_model_whose_layer_was_swapped_runs_eagerly(always_capture):
    def run(graphed: bool):
        model = small_model()
        g = torch.Generator().manual_seed(1)
        with fallbacks() as messages:
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
        return snapshot(model.parameters()), messages

    expected, _ = run(graphed=False)
    got, messages = run(graphed=True)
    assert len(messages) == 1 and "were replaced after the capture" in messages[0], messages
    assert_all_close(got, expected)
