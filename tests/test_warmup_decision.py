"""The decision before a first capture (runtime/common.py WarmupLoad): the warmup calls after a key's first
are timed, host time against GPU time, and work GPU-bound in GPU_BOUND_CALLS of them is left eager uncaptured,
unless a call run without the host-value recorder was not GPU-bound. Fake timings stand in for the CUDA
events here; tests/test_runtime_states.py drives the wrappers through it, tests/test_warmup_decision_gpu.py
runs it on CUDA. Also: a graphed model's call whose inputs a graph cannot take warns once."""

from __future__ import annotations

import warnings

import pytest
import torch

from graphify.runtime import GraphedModule, GraphifyFallbackWarning
from graphify.runtime.common import GPU_BOUND_CALLS, GPU_BOUND_SHARE, LOAD_CALLS, WarmupLoad, load_verdict
from graphify.runtime.graphed_module import untakeable
from graphify.runtime.states import registry

BOUND, LAUNCH = (10.0, 1.0), (1.0, 1.0)  # (GPU ms, host ms): GPU-bound; launch-bound (the GPU waits on the host)


class FakeTiming:
    """A timed call the GPU has run (`done`) or not; reading one not done waits for the GPU (`waits`), which
    then has run the calls timed before it too (one stream)."""

    waits = 0
    made: list = []

    def __init__(self, gpu_ms, host_ms, done=True):
        self.measured, self.finished = (gpu_ms, host_ms), done
        FakeTiming.made.append(self)

    def done(self):
        return self.finished

    def milliseconds(self):
        if not self.finished:
            FakeTiming.waits += 1
            for timing in FakeTiming.made[: FakeTiming.made.index(self) + 1]:
                timing.finished = True
        return self.measured


@pytest.fixture(autouse=True)
def fresh():
    FakeTiming.waits, FakeTiming.made = 0, []
    registry.reset()
    yield
    registry.reset()


def _samples(*timings, recorded=()):
    return [(*t, i in recorded) for i, t in enumerate(timings)]


def test_the_rule_wants_gpu_bound_calls_and_no_unrecorded_call_against():
    assert GPU_BOUND_CALLS == 3 and GPU_BOUND_SHARE == 0.5
    assert load_verdict(_samples(BOUND, BOUND, BOUND), "a step")[0] == "eager"
    assert load_verdict(_samples(BOUND, BOUND, BOUND, recorded=(0, 1)), "a step")[0] == "eager"  # recorded calls count for
    assert load_verdict(_samples(BOUND, BOUND), "a step") is None  # too few to tell
    assert load_verdict(_samples(LAUNCH), "a step") == ("capture", None)  # one unrecorded call settles it
    assert load_verdict(_samples(BOUND, BOUND, BOUND, LAUNCH), "a step") == ("capture", None)  # never eager against one
    # the recorder slows the host: a recorded call that is not GPU-bound says nothing either way
    assert load_verdict(_samples(LAUNCH, LAUNCH, BOUND, recorded=(0, 1)), "a step") is None
    assert load_verdict(_samples(LAUNCH, LAUNCH, BOUND, BOUND, BOUND, recorded=(0, 1)), "a step")[0] == "eager"
    assert load_verdict(_samples((10.0, 5.0), (10.0, 5.0), (10.0, 5.0)), "a step") == ("capture", None)  # at half: launches count
    assert load_verdict([], "a step") is None


def test_the_reason_gives_the_median_times():
    verdict, why = load_verdict(_samples((12.0, 2.0), (11.0, 1.0), (30.0, 3.0), recorded=(0,)), "its forward pass")
    assert verdict == "eager" and why == (
        "no gain expected: GPU-bound (its forward pass keeps the GPU busy 12.0 ms for 2.0 ms of host time, "
        "medians of 3 warmup calls each under 50%; GRAPHIFY_CAPTURE=always captures it anyway)"
    )


def test_the_first_decision_waits_for_the_calls_timed_later_ones_do_not():
    """The capture that follows the first decision waits for the GPU anyway; more timed calls, asked for
    when too few tell, are read once the GPU has run them, without waiting, up to LOAD_CALLS in all."""
    load = WarmupLoad()
    for recorded in (True, True, False):
        load.add(FakeTiming(*BOUND, done=False), recorded)
    assert load.verdict("a step")[0] == "eager" and FakeTiming.waits == 1  # one wait: the last call's end
    load = WarmupLoad()
    load.add(FakeTiming(*LAUNCH, done=False))
    assert load.verdict("a step") == ("capture", None) and FakeTiming.waits == 2
    load = WarmupLoad()
    load.add(FakeTiming(*BOUND, done=False))
    assert load.verdict("a step") == ("time", None) and FakeTiming.waits == 3
    for _ in range(LOAD_CALLS - 2):  # the GPU stays behind: the calls timed later are not read yet
        load.add(FakeTiming(*BOUND, done=False))
        assert load.verdict("a step") == ("time", None)
    assert FakeTiming.waits == 3
    load.add(FakeTiming(*BOUND, done=False))  # LOAD_CALLS timed: wait, decide
    assert load.verdict("a step")[0] == "eager" and FakeTiming.waits == 4


def test_after_load_calls_too_few_to_tell_capture():
    load = WarmupLoad()
    for _ in range(LOAD_CALLS):
        load.add(FakeTiming(*LAUNCH), recorded=True)  # slowed by the recorder: they say nothing
    assert load.verdict("a step") == ("capture", None)


def test_a_call_done_is_read_without_waiting():
    load = WarmupLoad()
    load.add(FakeTiming(*BOUND))
    load.add(FakeTiming(*BOUND, done=False))
    load.read(wait=False)
    assert load.samples == [(*BOUND, False)] and len(load.pending) == 1 and FakeTiming.waits == 0


# ---- a graphed model's inputs a graph cannot take ----------------------------------------------


class CudaLooking(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the call is one the model would graph, but for its inputs."""

    @property
    def is_cuda(self):
        return True


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, x, scale=None):
        return self.linear(x) * (1.0 if scale is None else 2.0)


def test_what_a_graph_cannot_take_in_words():
    x = torch.ones(2)
    assert untakeable((x, x), {"ratio": 0.5, "mode": "a", "flag": None}) is None
    assert untakeable((x, None), {}) == "its positional input 2 is None"
    assert untakeable(([x, x],), {}) == "its positional input 1 is a `list`"
    assert untakeable((x,), {"mask": x}) == "its keyword argument `mask` is a tensor"


def test_a_model_called_with_inputs_a_graph_cannot_take_warns_once():
    model = TwoInputs()
    graphed = GraphedModule(model)
    x = torch.ones(3, 2).as_subclass(CudaLooking)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            out = graphed(x, None)
            out.sum().backward()
    messages = [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]
    assert messages == [
        "graphify: the model runs eagerly: its positional input 2 is None, which a graph cannot take (its inputs are "
        "tensors, passed by position; plain values passed by keyword are part of its key): calls like it run eagerly"
    ]
    assert caught[0].filename == __file__  # shown at the caller's line
    assert graphed.state.disabled is None  # calls with inputs it can take are still graphed


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (lambda graphed: graphed(torch.ones(3, 2), None), "no CUDA tensor: a model run on the CPU"),
        (lambda graphed: graphed.module.eval() and graphed(torch.ones(3, 2).as_subclass(CudaLooking), None), "eval mode"),
    ],
)
def test_no_warning_for_calls_that_would_not_be_graphed_anyway(call, why):
    graphed = GraphedModule(TwoInputs())
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphifyFallbackWarning)
        call(graphed)
    assert not graphed.state.inputs_warned, why
