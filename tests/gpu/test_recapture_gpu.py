"""Settings a graph froze, moved by a scheduler, on a GPU: SGD reads its learning rate as a number, so a
per-epoch schedule (CIFAR and ImageNet recipes: SGD with momentum, cosine or step decay each epoch) makes
the step capture again each epoch, at once, for as many epochs as the run has; a schedule that moves
the rate every few steps leaves the step eager with one warning."""

from __future__ import annotations

import torch
from harness import assert_all_close, batches, eager, fallbacks, small_model, snapshot

from graphify.runtime import CapturedStep
from graphify.runtime.captured_step import FEW_REPLAYS, MAX_KEYS


def _train(wrap, epochs: int, steps: int, per_step: bool = False, momentum_from: int | None = None):
    """(parameters, the wrapped step, fallback messages, eager calls of the step): SGD with momentum and
    weight decay, its learning rate moved each epoch (or each step) by a cosine schedule; with
    `momentum_from`, SGD without momentum until that epoch."""
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9 if momentum_from is None else 0, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * (steps if per_step else 1))
    calls = []

    def train_step(x, y):
        calls.append(torch.cuda.is_current_stream_capturing())
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    step = wrap(train_step)
    data = batches(epochs * steps)
    with fallbacks() as messages:
        for epoch in range(epochs):
            if epoch == momentum_from:
                optimizer.param_groups[0]["momentum"] = 0.9  # its buffers are made by the next step
            for _ in range(steps):
                step(*next(data))
                if per_step:
                    scheduler.step()
            if not per_step:
                scheduler.step()
    return snapshot(model.parameters()), step, messages, calls.count(False)


def test_a_per_epoch_schedule_of_sgd_is_captured_again_each_epoch_without_a_new_warmup(always_capture, checks_by_count):
    """More epochs than MAX_KEYS, each long enough to pay for its capture: every epoch captures again with
    its learning rate (no warning, no eager call after the first warmup) and trains as eager."""
    epochs, steps = MAX_KEYS + 4, FEW_REPLAYS + 8
    expected = _train(eager, epochs, steps)[0]
    got, step, messages, eager_calls = _train(CapturedStep, epochs, steps)
    state = step.state
    assert messages == [] and state.graphs and state.disabled is None, messages
    assert state.recaptures == epochs - 1 and state.hasty_recaptures == 0
    # the first warmup (one recorded call more) and the recorded checks of the 128th, 256th and 512th replay:
    # a capture does not run the step eagerly, and a recapture does not warm up again
    assert eager_calls == step.warmup + 1 + 3
    assert_all_close(got, expected)


def test_a_learning_rate_moved_every_step_leaves_sgd_eager_with_one_warning(always_capture):
    expected = _train(eager, 2, 40, per_step=True)[0]
    got, step, messages, _ = _train(CapturedStep, 2, 40, per_step=True)
    assert len(messages) == 1 and f"changed within {FEW_REPLAYS} replays of its capture" in messages[0], messages
    assert step.state.disabled is not None and not step.state.graphs
    assert_all_close(got, expected)


def test_a_momentum_turned_on_warms_up_again_so_that_its_buffers_are_made_eagerly(always_capture):
    """A capture that made SGD's momentum buffers would zero them at every replay: the step warms up again
    after any setting but the learning rate moved."""
    expected = _train(eager, 4, FEW_REPLAYS + 8, momentum_from=2)[0]
    got, step, messages, eager_calls = _train(CapturedStep, 4, FEW_REPLAYS + 8, momentum_from=2)
    assert messages == [] and step.state.graphs and step.state.recaptures == 3 and eager_calls == 2 * (step.warmup + 1), messages
    assert_all_close(got, expected)
