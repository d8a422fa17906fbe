"""A step that sets its model's mode itself (`model.train()` at the top of a full-batch `train()`), called
after an evaluation that set eval mode: replays skip the call, so the runtime sets the mode the capture's
call set, and the graph was captured in that mode. Compared with eager, with dropout making modes count."""

from __future__ import annotations

import torch
from harness import assert_all_close, eager, snapshot

from graphify.runtime import CapturedStep


def _train(wrap, epochs=40):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(64, 1)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, capturable=True)
    x, y = torch.randn(256, 16, device="cuda"), torch.randn(256, 1, device="cuda")

    def step():
        model.train()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    step = wrap(step)
    losses, modes = [], []
    for epoch in range(epochs):
        losses.append(step().detach().clone())
        modes.append(model.training)
        if epoch % 3 == 0:
            model.eval()
            with torch.no_grad():
                model(x)
    return torch.stack(losses), modes, snapshot(model.parameters()), step


def test_modes_set_inside_the_step_are_set_after_each_replay(always_capture):
    losses, modes, params, _ = _train(eager)
    got_losses, got_modes, got_params, step = _train(CapturedStep)
    assert step.state.graphs, "the step was never captured"
    assert got_modes == modes == [True] * len(modes)
    assert_all_close([got_losses, *got_params], [losses, *params])
