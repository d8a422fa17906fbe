"""The runtime's host-value check on a GPU: a step or a forward whose Python values change between calls
through channels the source does not show (a property, an attribute a callback sets, a dict) stays eager
with one warning, from warmup; steps whose values hold still
(dropout, a per-step learning-rate schedule) are captured without a word."""

from __future__ import annotations

import torch
from harness import Schedule, assert_all_close, batches, eager, fallbacks, small_model, snapshot, train

from graphify.runtime import CapturedStep, GraphedModule


def _train(wrap, moves_at=None, steps=40):
    """(parameters, the wrapped step, fallback messages). `moves_at`: the steps at which the schedule moves
    (every step when None)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Dropout(0.1), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=steps, cycle_momentum=False)
    schedule = Schedule()

    def train_step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y) * schedule.weight
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    step = wrap(train_step)
    with fallbacks() as messages:
        for i, (x, y) in enumerate(batches(steps)):
            if moves_at is None or i in moves_at:
                schedule.t = i
            step(x, y)
            scheduler.step()
    return snapshot(model.parameters()), step, messages


def test_a_value_moving_every_step_keeps_the_step_eager_from_warmup(always_capture):
    expected = _train(eager)[0]
    got, step, messages = _train(CapturedStep)
    assert len(messages) == 1 and "a host value the step hands to the GPU changed between steps" in messages[0], messages
    assert not step.state.graphs
    assert_all_close(got, expected)


def test_values_that_hold_still_are_captured_without_a_word(always_capture):
    """Dropout and a per-step OneCycle schedule (a tensor learning rate, the optimizer's step left out):
    nothing the recorder sees moves."""
    got, step, messages = _train(CapturedStep, moves_at=set())
    assert messages == [] and step.state.graphs


_STATE = {"temperature": 1.0}


class _Tempered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))

    def forward(self, x):
        return self.net(x) / _STATE["temperature"]


def _train_tempered(graphed: bool, steps=30):
    torch.manual_seed(0)
    model = _Tempered().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    call = GraphedModule(model) if graphed else model
    g = torch.Generator().manual_seed(1)
    with fallbacks() as messages:
        for i in range(steps):
            _STATE["temperature"] = 1.0 + i / 10
            loss = call(torch.randn(32, 16, generator=g).cuda()).logsumexp(-1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return snapshot(model.parameters()), call, messages


def test_a_forward_reading_a_value_the_loop_moves_stays_eager(always_capture):
    expected = _train_tempered(graphed=False)[0]
    got, call, messages = _train_tempered(graphed=True)
    assert len(messages) == 1 and "the forward hands to the GPU changed between steps" in messages[0], messages
    assert call.state["graphed"] is None
    assert_all_close(got, expected)


def test_the_check_can_be_turned_off(always_capture, monkeypatch):
    """GRAPHIFY_HOST_CHECK=off: the planted-bug suite's wrong rewrites replay as written, for verify to catch."""
    monkeypatch.setenv("GRAPHIFY_HOST_CHECK", "off")
    got, step, messages = _train(CapturedStep)
    assert messages == [] and step.state.graphs


def _train_eps(wrap, steps=30):
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, capturable=True)

    def move_eps(i):
        if i in (10, 20):
            optimizer.param_groups[0].update(eps=1e-2 * i)  # a callback's move: the graph froze eps

    return train(wrap, model, optimizer, batches(steps), before=move_eps)


def test_any_optimizer_setting_a_graph_froze_is_followed(always_capture):
    """eps moved twice by `group.update`: each move drops the graphs and captures again, as for betas."""
    expected = _train_eps(eager).params
    got = _train_eps(CapturedStep)
    assert got.step.state.recaptures == 2 and got.step.state.graphs, got.messages
    assert_all_close(got.params, expected)


def test_attention_dropout_is_captured_without_a_word(always_capture):
    """Attention with dropout hands its backward the random seed and offset as host tensors that change at
    every call; they come from the device's own work (under capture they advance with the graph's
    generator), so the step is captured, and trains as eager."""

    def run(wrap):
        torch.manual_seed(0)
        proj = torch.nn.Linear(32, 96).cuda()
        optimizer = torch.optim.SGD(proj.parameters(), lr=0.05)

        def train_step(x):
            q, k, v = proj(x).view(8, 16, 3, 2, 16).unbind(2)
            out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=0.2)
            loss = out.float().square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        step = wrap(train_step)
        g = torch.Generator().manual_seed(1)
        with fallbacks() as messages:
            for _ in range(12):
                step(torch.randn(8, 16, 32, generator=g).cuda())
        return snapshot(proj.parameters()), step, messages

    expected = run(eager)[0]
    got, step, messages = run(CapturedStep)
    assert messages == [] and step.state.graphs, messages
    # efficient attention's backward adds up with atomics: two eager runs part at about 1e-4 here
    assert_all_close(got, expected, rtol=1e-3, atol=5e-4)


def _train_epochs(wrap, epochs=4, steps=140, moving=True):
    """A loss weight read through a property that moves once per epoch, in a train() entered each epoch:
    the warmup sees it hold still; only the epochs tell."""
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    schedule = Schedule()
    data = batches(epochs * steps)

    def train_epoch(epoch):
        schedule.t = 10 * epoch if moving else 0

        def train_step(x, y):
            loss = torch.nn.functional.mse_loss(model(x), y) * schedule.weight
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        step = wrap(train_step)
        for _ in range(steps):
            step(*next(data))
        return step

    with fallbacks() as messages:
        steps_run = [train_epoch(epoch) for epoch in range(epochs)]
    return snapshot(model.parameters()), steps_run[-1], messages


def test_a_value_moving_between_epochs_is_captured_again_when_the_loop_is_entered_again(always_capture, monkeypatch):
    expected = _train_epochs(eager)[0]
    got, step, messages = _train_epochs(CapturedStep)
    assert messages == [] and step.state.graphs and step.state.recaptures == 3, (messages, step.state.recaptures)
    assert_all_close(got, expected)
    monkeypatch.setenv("GRAPHIFY_HOST_CHECK", "off")  # without the check the first epoch's weight is replayed
    frozen = _train_epochs(CapturedStep)[0]
    assert any(not torch.allclose(a, b, rtol=1e-3, atol=1e-4) for a, b in zip(frozen, expected))


def test_a_value_that_starts_moving_mid_loop_is_found_at_the_next_check_with_a_warning(always_capture, checks_by_count):
    """One long loop, never entered again: a value set once at step 60, after the capture, is found at the
    128th replay; the step captures again with it and says that the replays before may have used the old one."""
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    schedule = Schedule()

    def train_step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y) * schedule.weight
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step = CapturedStep(train_step)
    x, y = torch.randn(32, 16, device="cuda"), torch.randn(32, 1, device="cuda")
    with fallbacks() as messages:
        for i in range(200):
            schedule.t = 0 if i < 60 else 5
            step(x, y)
    assert len(messages) == 1 and "captured again" in messages[0] and "moved after the capture" in messages[0], messages
    assert "up to 127 replays" in messages[0] and step.state.recaptures == 1 and step.state.graphs


def test_a_loop_entered_every_few_steps_is_not_checked_at_every_entry(always_capture, monkeypatch):
    """A recorded call costs many replays: 40 entries of 10 steps (an update called per rollout) check
    at most once per 128 replays, plus the 128th, 256th, ... replay."""
    checks = []
    rechecked = CapturedStep._rechecked
    monkeypatch.setattr(CapturedStep, "_rechecked", lambda self, *a: checks.append(a[-1]) or rechecked(self, *a))
    got, step, messages = _train_epochs(CapturedStep, epochs=40, steps=10, moving=False)
    assert messages == [] and step.state.graphs and step.state.recaptures == 0
    assert 2 <= len(checks) <= 5, checks  # about 395 replays: entries at ~128 and ~256 apart, periodic at 128 and 256


def test_a_graphed_model_reading_a_value_that_starts_moving_after_the_capture_goes_eager_at_the_next_check(always_capture):
    torch.manual_seed(0)
    model = _Tempered().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    call = GraphedModule(model)
    x = torch.randn(32, 16, device="cuda")
    with fallbacks() as messages:
        for i in range(160):
            _STATE["temperature"] = 1.0 if i < 40 else 2.0
            loss = call(x).logsumexp(-1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    _STATE["temperature"] = 1.0
    assert len(messages) == 1 and "moved after the capture" in messages[0] and "replays before this call" in messages[0], messages
    assert call.state["disabled"] is not None
