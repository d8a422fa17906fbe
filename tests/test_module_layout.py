"""What a graph was captured on besides its inputs (reach.layout), on the CPU: the tensors' addresses and
what the modules' forwards run. Pruning, parametrizations and hooks change it; training does not. The two
registration counters read before every replay move with each of those changes and stay still across
ordinary training steps, so that the layout is compared only when something was registered."""

from __future__ import annotations

import torch
import torch.nn.utils.parametrize as parametrize
import torch.nn.utils.prune as prune

from graphify.runtime.reach import layout, layout_change, registrations, watch_registrations


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _train(model, opt, steps=3):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 6)).square().mean().backward()
        opt.step()


def test_training_steps_change_neither_the_layout_nor_the_counters():
    watch_registrations()
    model = _model()
    opt = torch.optim.Adam(model.parameters())
    _train(model, opt, 1)  # the optimizer's state is made at its first step
    before, counted = layout([model], [opt]), registrations()
    _train(model, opt)
    model.eval()
    model.train()
    assert layout([model], [opt]) == before and registrations() == counted


def test_each_pruning_moves_the_counters_and_changes_what_the_forward_runs():
    """Pruning re-parametrizes the weight: `weight_orig` (the same parameter), a new `weight_mask` buffer
    and a forward pre-hook; pruning again replaces the mask and the hook."""
    watch_registrations()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        before, counted = layout([model], [opt]), registrations()
        prune.l1_unstructured(model[0], "weight", amount=0.3)
        assert registrations() != counted
        after = layout([model], [opt])
        assert after != before and layout_change(before, after).startswith("what a module's forward runs changed")
        _train(model, opt, 1)


def test_a_parametrization_a_hook_added_or_removed_and_a_swapped_layer_change_the_layout():
    watch_registrations()
    model = _model()
    before, counted = layout([model], []), registrations()

    parametrize.register_parametrization(model[2], "weight", torch.nn.Identity())
    assert registrations() != counted and layout([model], []) != before  # a class of its own, a submodule
    before, counted = layout([model], []), registrations()
    handle = model[1].register_forward_hook(lambda m, i, o: o * 0.5)
    assert registrations() != counted and layout([model], []) != before
    before = layout([model], [])
    handle.remove()  # not counted: found at the next layout check (loop entry, periodic check)
    assert layout([model], []) != before
    before, counted = layout([model], []), registrations()
    model[0] = torch.nn.Linear(6, 8)
    after = layout([model], [])
    assert registrations() != counted and after != before
    assert layout_change(before, after).startswith("parameters, buffers or optimizer state tensors were replaced")


def test_a_global_module_hook_changes_the_layout():
    model = _model()
    before = layout([model], [])
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: o)
    try:
        assert layout([model], []) != before
    finally:
        handle.remove()
    assert layout([model], []) == before
