"""The runtime's record of the host values a step hands to the GPU work: what it records, what it leaves
out (device tensors, optimizer steps), and how two calls compare.
Meta tensors stand in for device tensors: they reach the operators without values."""

from __future__ import annotations

import torch

from graphify.runtime import host_values
from graphify.runtime.host_values import HostValues, compiled, drift_reason, first_difference, recording_allowed


class _Schedule:
    def __init__(self):
        self.t = 0

    @property
    def weight(self):  # a property reading a counter the loop moves: nothing in the step's source shows it
        return self.t / 50


def _step(schedule, x, w):
    loss = ((x @ w).relu() * schedule.weight).sum()
    loss.backward()


def _recorded(schedule):
    x = torch.randn(4, 32, device="meta")
    w = torch.randn(32, 32, device="meta", requires_grad=True)
    with HostValues() as record:
        _step(schedule, x, w)
    return record.calls


def test_a_host_value_read_through_a_property_shows_as_an_operator_argument():
    schedule = _Schedule()
    schedule.t = 1
    first = _recorded(schedule)
    assert first_difference(first, _recorded(schedule)) is None  # the same value: the same record
    schedule.t = 2
    difference = first_difference(first, _recorded(schedule))
    assert difference is not None and "aten.mul" in difference and (0.02).hex() in difference and (0.04).hex() in difference
    reason = drift_reason(difference)
    assert "changed between steps" in reason and "pass it in as an argument" in reason


def test_device_tensors_are_recorded_without_their_values_and_small_host_tensors_with_them():
    assert host_values._value(torch.randn(2, 2, device="meta")) is None
    assert host_values._value(torch.tensor(0.5)) == ("host tensor", ((0.5).hex(),))
    assert host_values._value(torch.zeros(host_values.SMALL_HOST_TENSOR + 1)) is None  # a batch, not a value
    assert host_values._value([1, 2.0, None, torch.float16]) == (1, (2.0).hex(), None, torch.float16)
    assert host_values._value(float("nan")) == host_values._value(float("nan"))


def test_a_host_tensor_the_loop_fills_is_read_by_value():
    lam = torch.tensor(0.25)
    x = torch.randn(4, 32, device="meta")

    def record():
        with HostValues() as r:
            (x * lam).sum()
        return r.calls

    before = record()
    lam.fill_(0.5)
    assert first_difference(before, record()) is not None


def test_optimizer_steps_are_left_to_the_runtime(monkeypatch):
    """A per-step schedule moves SGD's float learning rate: the runtime follows optimizer settings itself
    (tensor learning rates, a new capture), so the step's own record stays the same."""
    monkeypatch.setattr(host_values, "SMALL_HOST_TENSOR", 0)  # on a CPU, parameters are host tensors too
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(8, 32)

    def step():
        with HostValues([optimizer]) as record:
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        return record.calls

    step()  # the first call makes the momentum buffers
    before = step()
    optimizer.param_groups[0]["lr"] = 0.05
    after = step()
    assert first_difference(before, after) is None
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks  # removed on exit


def test_differences_in_the_operators_themselves_are_named():
    a = [("aten.add.Tensor", (None, 1), ()), ("aten.mul.Tensor", (None, 2), ())]
    assert first_difference(a, a[:1]) == "it ran 2 operators, then 1"
    assert "`aten.mul.Tensor`, then `aten.div.Tensor`" in first_difference(a, [a[0], ("aten.div.Tensor", (None, 2), ())])


def test_the_check_can_be_turned_off_and_stays_away_from_compiled_code(monkeypatch):
    assert recording_allowed()
    monkeypatch.setenv("GRAPHIFY_HOST_CHECK", "off")
    assert not recording_allowed()
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert not compiled([model])
    model[0] = torch.compile(torch.nn.Linear(2, 2))  # compiled lazily: nothing is compiled here
    assert compiled([model])
    assert compiled([torch.compile(lambda x: x + 1)])


def test_operators_on_tensors_alone_are_left_out_and_keywords_kept():
    """`a + b` carries no host value (and autograd accumulates a gradient with `detach` on its first pass,
    `add_` later: no difference to report); `torch.add(a, b, alpha=2.0)` carries one."""
    x = torch.randn(4, device="meta")
    with HostValues() as record:
        torch.add(x, x)
        torch.add(x, x, alpha=2.0)
    assert record.calls == [("aten.add.Tensor", (None, None), (("alpha", (2.0).hex()),))]


def test_arguments_the_recorder_cannot_read_never_stop_the_step():
    """Sparse and quantized host tensors have no values to list: they are recorded by kind, and the
    operator runs as it would."""
    sparse = torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,))
    with HostValues() as record:
        doubled = sparse * 2
    assert torch.equal(doubled.to_dense(), torch.tensor([2.0, 4.0, 0.0])) and record.calls


_seeds = iter(range(1000))


@torch.library.custom_op("graphify_test::draw_seed", mutates_args=())
def _draw_seed(x: torch.Tensor) -> torch.Tensor:
    """Stands in for attention with dropout: an operator on device tensors that returns the random seed its
    backward takes, as a small host tensor holding a new value at every call."""
    return torch.tensor([next(_seeds)])


@_draw_seed.register_fake
def _(x):  # what it does on meta tensors, the stand-ins for device tensors here
    return torch.tensor([next(_seeds)])


def test_host_tensors_made_by_the_steps_device_work_are_not_host_values():
    x = torch.randn(4, 32, device="meta")

    def record(draw):
        with HostValues() as r:
            seed = draw(x)
            torch.ops.aten.add(seed, 1, alpha=1)  # what a backward does with its forward's seed
        return r.calls

    assert first_difference(record(_draw_seed), record(_draw_seed)) is None
    # a host tensor the step makes from host work alone carries a host value: recorded by value
    host_draw = lambda _: torch.randint(0, 1000, (1,), generator=torch.Generator().manual_seed(next(_seeds)))  # noqa: E731
    assert first_difference(record(host_draw), record(host_draw)) is not None
