"""What the runtime changes on an optimizer for a capture, and gives back when the step stays eager: the
capturable flag and where the step counts live."""

from __future__ import annotations

import warnings

import torch

from graphify.runtime import CapturedStep, GraphifyFallbackWarning
from graphify.runtime.optimizer_settings import give_back, make_capturable, moved_settings, use_tensor_lrs


def _stepped_adam(**kwargs):
    w = torch.nn.Parameter(torch.randn(4))
    optimizer = torch.optim.Adam([w], lr=1e-2, **kwargs)
    if not kwargs.get("capturable"):  # a capturable step needs a GPU
        w.grad = torch.ones(4)
        optimizer.step()
    return optimizer, w


def test_a_group_made_capturable_is_given_back_as_built():
    """(The step counts' move to the GPU and back is in tests/gpu/test_runtime_gpu.py.)"""
    optimizer, w = _stepped_adam()
    changed: list = []
    make_capturable([optimizer], changed)
    assert optimizer.param_groups[0]["capturable"] is True and changed == [(optimizer, optimizer.param_groups[0])]
    give_back(changed, in_use=[])
    assert optimizer.param_groups[0]["capturable"] is False and changed == []
    step = optimizer.state[w]["step"]
    assert step.device.type == "cpu" and step.dtype == torch.float32


def test_groups_built_capturable_and_optimizers_still_in_use_are_left_alone():
    built_capturable, _ = _stepped_adam(capturable=True)
    changed: list = []
    make_capturable([built_capturable], changed)
    assert changed == []
    shared, _ = _stepped_adam()
    make_capturable([shared], changed)
    give_back(changed, in_use=[shared])  # another step still captures with it
    assert shared.param_groups[0]["capturable"] is True


def test_settings_a_graph_froze_are_followed():
    optimizer, _ = _stepped_adam()
    counts, frozen, lrs = [], [], []
    swapped = use_tensor_lrs([optimizer], lrs, frozen, counts)
    group = optimizer.param_groups[0]
    assert torch.is_tensor(group["lr"]) and swapped == [(group, 1e-2)] and lrs[0][2] == 1e-2
    group["lr"] = 1e-2
    assert moved_settings(counts, frozen) is None
    group["betas"] = (0.8, 0.999)
    assert moved_settings(counts, frozen) == "other"


def test_a_moved_float_learning_rate_alone_is_told_from_other_settings():
    """SGD reads its rate as a number: moved alone, the step may capture again at once; with a momentum
    turned on, or a group added, the next step makes optimizer state lazily and must run eagerly first."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    counts, frozen = [], []
    assert use_tensor_lrs([optimizer], [], frozen, counts) == []
    group = optimizer.param_groups[0]
    group["lr"] = 0.05
    assert moved_settings(counts, frozen) == "lr"
    group["momentum"] = 0.9
    assert moved_settings(counts, frozen) == "other"
    group["lr"], group["momentum"] = 0.1, 0
    assert moved_settings(counts, frozen) is None
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    assert moved_settings(counts, frozen) == "other"


class _LearningRateOnly(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})


def test_a_group_with_one_setting_is_followed_as_one_with_many():
    """Settings are compared a group at a time, by identity first: one setting alone too, and a value
    that equals nothing, not even itself (NaN), moves only when replaced."""
    optimizer = _LearningRateOnly([torch.nn.Parameter(torch.zeros(2))])
    counts, frozen = [], []
    use_tensor_lrs([optimizer], [], frozen, counts)
    group = optimizer.param_groups[0]
    assert [names for _, names, _, _ in frozen] == [("lr",)] and moved_settings(counts, frozen) is None
    group["lr"] = 0.05
    assert moved_settings(counts, frozen) == "lr"
    group["lr"], group["eps"] = float("nan"), float("nan")
    counts, frozen = [], []
    use_tensor_lrs([optimizer], [], frozen, counts)
    assert moved_settings(counts, frozen) is None
    group["eps"] = float("nan")
    assert moved_settings(counts, frozen) == "other"


def test_a_step_that_gives_up_warns_once_at_the_callers_line():
    step = CapturedStep(lambda x: x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step._give_up("a reason")  # the line the warning must point at
    assert len(caught) == 1 and issubclass(caught[0].category, GraphifyFallbackWarning)
    assert (
        caught[0].filename == __file__
        and caught[0].lineno == test_a_step_that_gives_up_warns_once_at_the_callers_line.__code__.co_firstlineno + 4
    )
    assert step.state.disabled == "a reason" and not step.state.graphs
