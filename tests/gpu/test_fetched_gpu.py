"""Batches fetched in each micro-step (`train_step.fetch(lambda: next(loader), k)`) on a GPU: fetched in
pass order during the first calls, all before each replay once those calls showed that fetching leaves
the CUDA generator alone, training as the eager loop does; a fetch that draws on the GPU keeps the step
eager with one warning."""

from __future__ import annotations

import torch
from harness import assert_all_close, fallbacks, snapshot

from graphify.runtime import CapturedStep

MICRO_STEPS = 3


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(32, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def _host_batches():
    g = torch.Generator().manual_seed(1)
    while True:
        yield torch.randn(16, 9, generator=g).cuda()


def _device_batches():
    while True:
        yield torch.randn(16, 9, device="cuda")  # the device generator, which dropout draws from too


def _train(loader, graphed: bool, updates: int = 12):
    model, opt = _setup()

    def train_step(batches):
        for micro in range(MICRO_STEPS):
            batch = batches[micro]
            loss = torch.nn.functional.mse_loss(model(batch[:, :8]), batch[:, 8:]) / MICRO_STEPS
            loss.backward()
        opt.step()
        return loss

    step = CapturedStep(train_step) if graphed else train_step
    with fallbacks() as messages:
        for _ in range(updates):
            if graphed:
                step(step.fetch(lambda: next(loader), MICRO_STEPS))
            else:
                for micro in range(MICRO_STEPS):  # as the source reads: fetch, forward, backward, per pass
                    batch = next(loader)
                    loss = torch.nn.functional.mse_loss(model(batch[:, :8]), batch[:, 8:]) / MICRO_STEPS
                    loss.backward()
                opt.step()
            opt.zero_grad()
    graphs = len(step.state.graphs) if graphed else 0
    return snapshot(model.parameters()), torch.cuda.get_rng_state(), messages, graphs


def test_micro_step_batches_from_the_host_are_fetched_ahead_and_train_the_same():
    eager, eager_rng, _, _ = _train(_host_batches(), graphed=False)
    graphed, graphed_rng, messages, graphs = _train(_host_batches(), graphed=True)
    assert messages == [] and graphs == 1
    assert torch.equal(eager_rng, graphed_rng)  # dropout drew the same numbers in the same order
    assert_all_close(graphed, eager)


def test_a_fetch_that_draws_on_the_gpu_keeps_the_step_eager_and_in_order():
    eager, eager_rng, _, _ = _train(_device_batches(), graphed=False)
    graphed, graphed_rng, messages, graphs = _train(_device_batches(), graphed=True)
    assert graphs == 0 and len(messages) == 1 and "CUDA generator" in messages[0]
    assert torch.equal(eager_rng, graphed_rng)  # fetched in pass order: the same draws for batches and dropout
    assert_all_close(graphed, eager)  # AdamW runs with capturable=True, set on the first call
