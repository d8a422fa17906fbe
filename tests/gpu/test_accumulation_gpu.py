"""Gradient accumulation with a GradScaler, on a GPU, in the form the rewrite gives it: the forward and the
scaled backward replayed from a graph, unscaling, clipping, the scaler's step and update and `zero_grad`
eager every k micro-batches. Whether the capture lands right after a `zero_grad` (no gradient exists),
mid-cycle or on the optimizer's micro-batch, with `set_to_none` True or False, the scaler enabled (fp16)
or not (bf16), the replays must add up the gradients exactly as eager backward passes do."""

from __future__ import annotations

import pytest
import torch
from harness import assert_all_close, eager, fallbacks, snapshot

from graphify.runtime import CapturedStep


def _train(wrap, k: int, set_to_none: bool, dtype, steps: int = 24, short_at: int | None = None):
    """(parameters, the wrapped step, fallback messages); `short_at`: that micro-batch is shorter (eager)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)

    def train_step(x, y):
        with torch.autocast("cuda", dtype=dtype):
            loss = torch.nn.functional.mse_loss(model(x), y) / k
        scaler.scale(loss).backward()
        return loss

    step = wrap(train_step)
    g = torch.Generator().manual_seed(1)
    with fallbacks() as messages:
        for i in range(1, steps + 1):
            n = 9 if i == short_at else 32
            step(torch.randn(n, 16, generator=g).cuda(), torch.randn(n, 4, generator=g).cuda())
            if i % k == 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=set_to_none)
    return snapshot(model.parameters()), step, messages


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16-scaler-off", "fp16-scaler-on"])
@pytest.mark.parametrize("set_to_none", [True, False], ids=["set-to-none", "zeroed"])
@pytest.mark.parametrize("k", [1, 3, 4, 5], ids=lambda k: f"k{k}")
def test_replays_accumulate_gradients_as_eager_backward_passes(always_capture, k, set_to_none, dtype):
    """The warmup runs 4 eager calls and the 5th captures: with k=4 (and k=1) the capture follows a
    `zero_grad`, with k=3 it lands mid-cycle, with k=5 on the optimizer's micro-batch."""
    expected = _train(eager, k, set_to_none, dtype)[0]
    got, step, messages = _train(CapturedStep, k, set_to_none, dtype)
    assert messages == [] and step.state.graphs and step.state.recaptures <= 1, (messages, step.state.recaptures)
    assert_all_close(got, expected)


def test_a_short_micro_batch_between_replays_adds_into_the_graphs_gradients(always_capture):
    """A short micro-batch runs eagerly; its backward makes new gradients after a `zero_grad`, and the next
    replay takes them in before adding its own."""
    expected = _train(eager, 4, True, torch.float16, short_at=13)[0]
    got, step, messages = _train(CapturedStep, 4, True, torch.float16, short_at=13)
    assert messages == [] and step.state.graphs
    assert_all_close(got, expected)
