"""What a captured step's backward does to `.grad`, on the CPU: GradientWatch classifies the gradients of
a step run under it (as a capture runs it), and GraphGradients puts `.grad` where a replay reads and leaves
it. A replay of a graph that adds into held gradients is emulated by an eager backward onto those same
tensors, which is what the captured kernels do at their addresses."""

from __future__ import annotations

import torch

from graphify.runtime.gradients import GradientWatch


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 6, generator=g), torch.randn(5, 2, generator=g)) for _ in range(n)]


def _backward(model, x, y, k=1):
    (torch.nn.functional.mse_loss(model(x), y) / k).backward()


def _watched(model, step):
    watch = GradientWatch(list(model.parameters()))
    try:
        step()
    finally:
        watch.close()
    return watch.gradients()


def test_a_capture_onto_gradients_present_adds_into_them_and_replays_accumulate_as_eager(monkeypatch):
    """Gradient accumulation over k micro-batches with `zero_grad(set_to_none=True)` after each optimizer
    step, captured on a micro-batch with gradients present: before each replay the held gradients take in
    what `.grad` holds, zeros after a `zero_grad`, so every cycle sums exactly its k micro-batches."""
    k, batches = 3, _batches(12)

    def run(captured_at=None):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        grads = None
        for i, (x, y) in enumerate(batches, start=1):
            if captured_at is not None and i == captured_at:
                grads = _watched(model, lambda: _backward(model, x, y, k))
            else:
                if grads is not None:  # the replay adds into the held tensors, as this backward does
                    assert grads.ready() and all(p.grad is t for p, t, _ in grads.held)
                _backward(model, x, y, k)
            if i % k == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
        return [p.detach() for p in model.parameters()], grads

    expected, _ = run()
    got, grads = run(captured_at=5)  # the second micro-batch of a cycle
    assert len(grads.held) == 4 and not grads.fresh and not grads.left
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_held_gradients_take_in_another_tensor_or_zeros_before_a_replay():
    model = _model()
    x, y = _batches(1)[0]
    _backward(model, x, y)
    grads = _watched(model, lambda: _backward(model, x, y))
    held = [t for _, t, _ in grads.held]
    first = next(model.parameters())
    other = torch.full_like(first, 3.0)
    first.grad = other
    assert grads.ready() and first.grad is held[0] and torch.equal(held[0], other)
    model.zero_grad(set_to_none=True)
    assert grads.ready() and all(p.grad is t for p, t in zip(model.parameters(), held))
    assert all(not t.any() for t in held)


def test_a_capture_without_gradients_makes_fresh_ones_and_is_captured_again_onto_present_ones():
    """Captured right after a `zero_grad(set_to_none=True)`, the graph writes gradients of its own, which a
    replay overwrites: fine while each replay follows a `zero_grad`; a gradient still present (the next
    micro-batch adds to it) makes `ready` refuse, with `.grad` left as it was."""
    model = _model()
    x, y = _batches(1)[0]
    grads = _watched(model, lambda: _backward(model, x, y))
    made = [p.grad for p in model.parameters()]
    assert len(grads.fresh) == 4 and not grads.held and [g for _, g in grads.left] == made
    model.zero_grad(set_to_none=True)
    assert grads.ready() and all(p.grad is g for p, g in zip(model.parameters(), made))
    assert not grads.ready()  # accumulating: the gradients are present
    assert all(p.grad is g for p, g in zip(model.parameters(), made))


def test_a_step_that_unsets_the_gradients_itself_reads_none_of_them():
    """`optimizer.zero_grad()` inside the step: the gradients present at capture are dropped, not read, so
    nothing is restored before a replay; `.grad` points at what the step made."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batches(1)[0]
    _backward(model, x, y)

    def step():
        opt.zero_grad()
        _backward(model, x, y)
        opt.step()

    grads = _watched(model, step)
    made = [p.grad for p in model.parameters()]
    assert not grads.held and not grads.fresh and len(grads.left) == 4
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    assert grads.ready() and all(p.grad is g for p, g in zip(model.parameters(), made))


def test_a_parameter_the_backward_does_not_reach_keeps_no_gradient():
    """An unused layer has no gradient in eager code, and the watch neither holds nor expects one."""
    model = _model()
    unused = torch.nn.Parameter(torch.ones(3))
    x, y = _batches(1)[0]
    watch = GradientWatch([*model.parameters(), unused])
    _backward(model, x, y)
    watch.close()
    grads = watch.gradients()
    assert len(grads.fresh) == 4 and all(p is not unused for p in grads.fresh)
    model.zero_grad(set_to_none=True)
    assert grads.ready() and unused.grad is None


def test_a_gradient_changed_in_place_but_not_reached_by_the_backward_is_captured_again_once_unset():
    """The step clips every gradient present, one of them a parameter its backward does not reach: eager
    code after a `zero_grad` would leave that one unset, a replay would clip (and keep) a zeroed one."""
    model = _model()
    unused = torch.nn.Parameter(torch.ones(3))
    unused.grad = torch.ones(3)
    x, y = _batches(1)[0]
    _backward(model, x, y)
    params = [*model.parameters(), unused]
    watch = GradientWatch(params)
    _backward(model, x, y)
    torch.nn.utils.clip_grad_norm_(params, 0.1)
    watch.close()
    grads = watch.gradients()
    assert [reached for p, _, reached in grads.held if p is unused] == [False]
    for p in params:
        p.grad = None
    assert not grads.ready()
    assert all(p.grad is None for p in params)


def test_the_watch_removes_its_hooks():
    model = _model()
    x, y = _batches(1)[0]
    grads = _watched(model, lambda: _backward(model, x, y))
    assert len(grads.fresh) == 4
    model.zero_grad(set_to_none=True)
    watch = GradientWatch([])
    _backward(model, x, y)  # no hook of the first watch records it any more
    watch.close()
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
