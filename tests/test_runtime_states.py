"""The runtime's state machine on the CPU (runtime/states.py): each key goes WARMUP, RECORD, RECORD, TIMED,
CAPTURE, then CAPTURED, and EAGER for good once a reason is found, with one warning. What touches CUDA is
faked (the side stream, the graph, the clocks): each call logs what it ran, so a phase skipped, repeated
or run out of turn changes the log. The CUDA tests (tests/gpu/) run the real thing."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import math
import warnings

import pytest
import torch

from graphify.runtime import CapturedStep, GraphedModule, GraphifyFallbackWarning
from graphify.runtime import captured_step as captured_step_module
from graphify.runtime import graphed_module as graphed_module_module
from graphify.runtime import states
from graphify.runtime.captured_step import MAX_KEYS, CapturedGraph
from graphify.runtime.common import TRIAL_BLOCK, TRIAL_BLOCKS, LoopTrial, leaves, tree_map
from graphify.runtime.gradients import GradientWatch, GraphGradients
from graphify.runtime.graphed_module import ModuleGraph
from graphify.runtime.host_values import RECHECK_FROM
from graphify.runtime.optimizer_settings import use_tensor_lrs
from graphify.runtime.states import KeyState, Phase, registry, warmup_phase

EAGER_MS, REPLAY_MS = 2.0, 1.0
TRIAL_CALLS = TRIAL_BLOCK * TRIAL_BLOCKS
WARMUP_LOG = ["eager", "record", "record", "timed", "capture+replay"]  # warmup 3, one call more recorded (timed too)
FORCED_LOG = ["eager", "record", "record", "eager", "capture+replay"]  # GRAPHIFY_CAPTURE=always: nothing timed


class Clock:
    """The host's clock as the loop trial reads it: each faked eager call or replay moves it. It holds the
    log of the call under way too, which a graph replayed by a later wrapper of the same step writes to."""

    def __init__(self):
        self.now = 0.0
        self.log: list = []

    def __call__(self) -> float:
        return self.now


class Measured:
    """A Timing whose measurement is given, (GPU ms, host ms), and read at once."""

    def __init__(self, gpu_ms, host_ms):
        self.measured = (gpu_ms, host_ms)

    def done(self):
        return True

    def milliseconds(self):
        return self.measured


class FakeGraph:
    def __init__(self, clock, replay_ms):
        self.clock, self.replay_ms = clock, replay_ms

    def replay(self):
        self.clock.log.append("replay")
        self.clock.now += self.replay_ms / 1e3

    def pool(self):
        return None


class Traced(CapturedStep):
    """A CapturedStep that takes the CPU for CUDA: an eager call runs the step, a capture records a graph
    whose replay logs "replay", and each call logs what it ran."""

    def __init__(self, step, clock, timed=(1.0, 1.0), replay_ms=REPLAY_MS, recorded_timed=None, **kwargs):
        self.clock, self.timed, self.replay_ms, self.quiet, self.calls = clock, timed, replay_ms, False, []
        self.recorded_timed = recorded_timed or timed  # (GPU ms, host ms) of a RECORD call: the recorder slows the host
        super().__init__(step, **kwargs)

    def __call__(self, *inputs, **kwargs):
        self.clock.log = []
        result = super().__call__(*inputs, **kwargs)
        self.calls.append("+".join(self.clock.log))
        return result

    def _on_cuda(self, tensors) -> bool:
        return True

    def _eager(self, tensors, inputs, timed=False, recorded=False):
        if not self.quiet:
            self.clock.log.append("timed" if timed else "eager")
        self.state.side_stream_used = True
        if timed:
            self.state.load.add(Measured(*(self.recorded_timed if recorded else self.timed)), recorded)
        self.clock.now += EAGER_MS / 1e3
        return self.step(*inputs)

    def _compared(self, *args, **kwargs):
        return self._logged("record", super()._compared, *args, **kwargs)

    def _rechecked(self, *args, **kwargs):
        return self._logged("check", super()._rechecked, *args, **kwargs)

    def _logged(self, what, run, *args, **kwargs):
        self.clock.log.append(what)
        self.quiet = True
        try:
            return run(*args, **kwargs)
        finally:
            self.quiet = False

    def _record_graph(self, key, device, inputs):
        """As a capture: the settings the graph freezes taken, the step run on static copies of the inputs."""
        self.clock.log.append("capture")
        state = self.state
        for group, lr in use_tensor_lrs(state.optimizers, state.lr_tensors, state.frozen, state.group_counts):
            group["lr"] = lr
        static_inputs = tree_map(torch.Tensor.clone, inputs)
        outputs = self.step(*static_inputs)
        return CapturedGraph(
            FakeGraph(self.clock, self.replay_ms), leaves(static_inputs), outputs, GraphGradients([], [], []), (), []
        ), None


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No state left by another test; the loop trial on the fake clock only (no CUDA events)."""
    registry.reset()
    clock = Clock()
    monkeypatch.setattr(captured_step_module, "LoopTrial", functools.partial(LoopTrial, clock=clock))
    monkeypatch.setattr(captured_step_module, "trial_event", lambda device: None)
    monkeypatch.delenv("GRAPHIFY_CAPTURE", raising=False)
    monkeypatch.delenv("GRAPHIFY_HOST_CHECK", raising=False)
    yield clock
    registry.reset()


def run(wrapped, calls: int, *inputs, **kwargs) -> tuple[list, list]:
    """What each of `calls` calls ran, and the fallback warnings they gave."""
    start = len(wrapped.calls)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(calls):
            wrapped(*inputs, **kwargs)
    return wrapped.calls[start:], [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]


def _double(x):
    return x * 2


def test_the_phases_of_a_key_in_order():
    assert [warmup_phase(runs, 3 + 1, True) for runs in range(5)] == [Phase.WARMUP, Phase.RECORD, Phase.RECORD, Phase.TIMED, Phase.CAPTURE]
    assert [warmup_phase(runs, 3, False) for runs in range(4)] == [Phase.WARMUP, Phase.WARMUP, Phase.TIMED, Phase.CAPTURE]
    assert [warmup_phase(runs, 11, False) for runs in range(12)] == [Phase.WARMUP] * 10 + [Phase.TIMED, Phase.CAPTURE]  # DDP
    assert KeyState(eager_runs=4, graph=object()).phase(4, True) is Phase.CAPTURED


def test_a_step_warms_up_records_twice_is_timed_captures_then_replays(fresh):
    step = Traced(_double, fresh)
    x = torch.ones(3)
    calls, messages = run(step, 5 + TRIAL_CALLS + 3, x)
    trial = (["replay"] * TRIAL_BLOCK + ["eager"] * TRIAL_BLOCK) * (TRIAL_BLOCKS // 2)
    assert calls == WARMUP_LOG + trial + ["replay"] * 3 and messages == []
    (key,) = step.state.keys
    assert step.state.phase(key, 4) is Phase.CAPTURED and step.state.trial is None
    assert step.state.trial_costs == pytest.approx((EAGER_MS, REPLAY_MS))
    assert torch.equal(step(x), x * 2)


def test_without_the_host_check_there_is_no_record_phase(fresh, monkeypatch):
    monkeypatch.setenv("GRAPHIFY_HOST_CHECK", "off")
    calls, messages = run(Traced(_double, fresh), 5, torch.ones(3))
    assert calls == ["eager", "timed", "timed", "capture+replay", "replay"] and messages == []


def test_each_key_has_phases_of_its_own(fresh):
    step = Traced(_double, fresh)
    x = torch.ones(3)
    calls = [run(step, 1, x, key=(flag,))[0][0] for flag in [True, False] * 5]
    assert calls[0::2] == WARMUP_LOG
    assert calls[1::2] == WARMUP_LOG  # timed until the first capture decides, whatever the key
    assert len(step.state.graphs) == 2


def test_a_gpu_bound_timed_call_leaves_the_step_eager_at_its_capture(fresh):
    step = Traced(_double, fresh, timed=(12.0, 2.0))  # the GPU busy 12 ms for 2 ms of launches
    calls, messages = run(step, 7, torch.ones(3))
    assert calls == WARMUP_LOG[:4] + ["eager"] * 3
    assert len(messages) == 1 and "no gain expected: GPU-bound" in messages[0]
    assert step.state.phase(next(iter(step.state.keys)), 4) is Phase.EAGER and not step.state.graphs


def test_gpu_bound_unrecorded_calls_ask_for_more_timed_calls_when_the_recorded_ones_say_nothing(fresh):
    """The recorder slowed the RECORD calls' host (not GPU-bound there): the TIMED call alone is too few,
    so the CAPTURE call runs eagerly, timed, until GPU_BOUND_CALLS unrecorded calls are GPU-bound."""
    step = Traced(_double, fresh, timed=(12.0, 2.0), recorded_timed=(12.0, 12.0))
    calls, messages = run(step, 8, torch.ones(3))
    assert calls == WARMUP_LOG[:4] + ["timed", "timed"] + ["eager"] * 2
    assert len(messages) == 1 and "medians of 3 warmup calls" in messages[0] and not step.state.graphs


def test_gpu_bound_only_while_recorded_is_captured_at_once(fresh):
    step = Traced(_double, fresh, timed=(1.0, 1.0), recorded_timed=(12.0, 2.0))
    calls, messages = run(step, 6, torch.ones(3))
    assert calls == WARMUP_LOG + ["replay"] and messages == []


def test_without_the_host_check_a_gpu_bound_step_is_timed_once_more(fresh, monkeypatch):
    monkeypatch.setenv("GRAPHIFY_HOST_CHECK", "off")  # warmup 3: two calls timed before the CAPTURE call
    calls, messages = run(Traced(_double, fresh, timed=(12.0, 2.0)), 6, torch.ones(3))
    assert calls == ["eager", "timed", "timed", "timed", "eager", "eager"]
    assert len(messages) == 1 and "no gain expected: GPU-bound" in messages[0]


def test_capture_forced_skips_the_decision_and_the_trial(fresh, monkeypatch):
    monkeypatch.setenv("GRAPHIFY_CAPTURE", "always")
    calls, messages = run(Traced(_double, fresh, timed=(12.0, 2.0)), 7, torch.ones(3))
    assert calls == FORCED_LOG + ["replay"] * 2 and messages == []


def test_host_values_that_differ_between_the_record_calls_leave_the_step_eager(fresh):
    weights = iter([0.5, 0.5, 0.25] + [0.25] * 10)  # a loss weight moved by code the source does not show

    def step_function(x):
        return torch.mul(x, next(weights))

    calls, messages = run(Traced(step_function, fresh), 6, torch.ones(3))
    assert calls == ["eager", "record", "record", "eager", "eager", "eager"]
    assert len(messages) == 1 and "a host value the step hands to the GPU changed between steps" in messages[0]


def test_replays_no_faster_in_the_loop_leave_the_step_eager_after_the_trial(fresh):
    step = Traced(_double, fresh, replay_ms=3 * EAGER_MS)
    calls, messages = run(step, 5 + TRIAL_CALLS + 2, torch.ones(3))
    assert calls[: 5 + TRIAL_CALLS] == WARMUP_LOG + (["replay"] * 4 + ["eager"] * 4) * 3
    assert calls[5 + TRIAL_CALLS :] == ["eager", "eager"]
    assert len(messages) == 1 and "no gain expected: measured in its loop" in messages[0] and step.state.graphs == {}


def test_too_many_keys_leave_the_step_eager(fresh):
    step = Traced(_double, fresh)
    x = torch.ones(3)
    calls = [run(step, 1, x, key=(n,)) for n in range(MAX_KEYS + 2)]
    assert [c for c, _ in calls] == [["eager"]] * (MAX_KEYS + 2)
    assert [m for _, m in calls].count([]) == MAX_KEYS + 1 and "more than 16 values" in calls[MAX_KEYS][1][0]


def _sgd_step(model, optimizer):
    def train_step(x):
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        return loss

    return train_step


def test_a_learning_rate_moved_captures_again_at_once_and_a_momentum_after_a_new_warmup(fresh, monkeypatch):
    """SGD reads a float learning rate, which its graph freezes: moved, the graph is dropped and the next
    call captures again (CAPTURED -> CAPTURE); a momentum turned on needs state made eagerly (-> WARMUP)."""
    monkeypatch.setenv("GRAPHIFY_HOST_CHECK", "off")  # on the CPU every small tensor is a host value: the loss
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = Traced(_sgd_step(model, optimizer), fresh)
    x = torch.randn(8, 4)
    assert run(step, 5, x) == (["eager", "timed", "timed", "capture+replay", "replay"], [])
    optimizer.param_groups[0]["lr"] = 0.05
    assert run(step, 2, x) == (["capture+replay", "replay"], [])
    optimizer.param_groups[0]["momentum"] = 0.9
    assert run(step, 5, x) == (["eager", "eager", "eager", "capture+replay", "replay"], [])  # timed before the first capture only
    assert step.state.recaptures == 2


def test_a_loop_entered_again_checks_its_graph_at_its_next_replay(fresh, monkeypatch):
    """A replay runs recorded and compared at the 128th replay, and at the first one after the loop is
    entered again once 128 replays have run since such a check."""
    monkeypatch.setenv("GRAPHIFY_CAPTURE", "always")  # no trial: every call after the capture replays
    monkeypatch.setattr(states, "MAX_CHECK_SHARE", math.inf)  # the CPU's fake replays cost nothing: no wait for time
    x = torch.ones(3)
    first = Traced(_double, fresh)
    calls, _ = run(first, 5 + RECHECK_FROM + 1, x)
    assert calls[: len(FORCED_LOG)] == FORCED_LOG
    replays = calls[len(FORCED_LOG) :]
    assert [i for i, c in enumerate(replays, 1) if c != "replay"] == [RECHECK_FROM] and replays[RECHECK_FROM - 1] == "check"
    again = Traced(_double, fresh)  # the next epoch: the same function and objects
    assert again.state is first.state
    assert run(again, 2, x) == (["check", "replay"], [])  # 130 replays since the last check on entering
    third = Traced(_double, fresh)
    assert run(third, 2, x) == (["replay", "replay"], [])  # 2 since


def test_the_registry_keeps_a_state_per_step_and_objects_and_forgets_on_reset(fresh):
    model = torch.nn.Linear(2, 2)
    first = CapturedStep(lambda x: model(x))

    def make():
        return CapturedStep(lambda x: model(x))

    second, third = make(), make()
    assert second.state is third.state and first.state is not second.state  # another code object: its own state
    graphed = GraphedModule(model)
    assert GraphedModule(model).state is graphed.state
    registry.reset()
    assert make().state is not second.state and GraphedModule(model).state is not graphed.state


class TracedModule(GraphedModule):
    """A GraphedModule that takes the CPU for CUDA (the side stream, the timing and the graph faked): a
    replay runs the module and logs "replay"."""

    def __init__(self, module, clock, **kwargs):
        self.clock, self.calls = clock, []
        super().__init__(module, **kwargs)

    def __call__(self, *inputs, **constants):
        self.clock.log = []
        result = super().__call__(*inputs, **constants)
        self.calls.append("+".join(self.clock.log) or "eager")
        return result

    def _graphable(self, inputs, constants) -> bool:
        return self.module.training and torch.is_grad_enabled()

    def _compared(self, *args, **kwargs):
        self.clock.log.append("record")
        return super()._compared(*args, **kwargs)

    def _graph(self, signature, inputs, constants):
        self.clock.log.append("capture")
        trained = [p for p in self.module.parameters() if p.requires_grad]

        def graphed(*args):
            self.clock.log.append("replay")
            self.clock.now += REPLAY_MS / 1e3
            return self.module.linear(*args[: len(inputs)])

        state = self.state
        state.entry(signature).graph, state.signature = ModuleGraph(graphed, trained), signature
        state.trial = LoopTrial(clock=self.clock)
        return None


@pytest.fixture
def cpu_streams(monkeypatch, fresh):
    """The side stream and its timing, on the CPU: no-ops, the timed calls logged."""

    class Stream:
        def wait_stream(self, other):
            pass

    class Timing(Measured):
        def __init__(self, stream):
            super().__init__(1.0, 1.0)
            fresh.log.append("timed")

        def stop(self):
            pass

    monkeypatch.setattr(graphed_module_module, "side_stream", lambda device: Stream())
    monkeypatch.setattr(graphed_module_module, "Timing", Timing)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())


class Clocked(torch.nn.Module):
    """A layer whose eager forward takes EAGER_MS on the fake clock (a replay runs `linear` alone)."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x):
        self.clock.now += EAGER_MS / 1e3
        return self.linear(x)


def _train(module_call, model, x, calls: int, backward=True):
    for _ in range(calls):
        out = module_call(x)
        if backward:
            out.square().mean().backward()
            model.zero_grad()


MODEL_WARMUP_LOG = ["eager", "timed+record", "timed+record", "timed"]  # a signature's first call is not timed


@pytest.mark.usefixtures("cpu_streams")
def test_a_model_warms_up_records_twice_is_timed_captures_then_replays(fresh):
    model = Clocked(fresh)
    call = TracedModule(model, fresh)
    _train(call, model, torch.randn(8, 4), 5 + TRIAL_CALLS + 2)
    trial = (["replay"] * TRIAL_BLOCK + ["eager"] * TRIAL_BLOCK) * (TRIAL_BLOCKS // 2)
    assert call.calls == MODEL_WARMUP_LOG + ["capture+replay"] + trial[1:] + ["replay"] * 3
    assert call.state["graphed"] is not None and call.state.trial is None


@pytest.mark.usefixtures("cpu_streams")
def test_a_model_waits_for_the_backward_of_its_last_warmup_call_and_of_its_replay(fresh):
    """Capture changes buffers in place: it waits for the backward of the last warmup call (one more timed
    call), and a call made while a replay's backward is to come runs eagerly."""
    model = Clocked(fresh)
    call = TracedModule(model, fresh)
    x = torch.randn(8, 4)
    _train(call, model, x, 3)
    _train(call, model, x, 2, backward=False)  # the last warmup call's backward never comes
    assert call.calls == MODEL_WARMUP_LOG + ["timed"]
    call.state.warmup_awaiting = False  # as once that backward ran
    _train(call, model, x, 1, backward=False)
    assert call.calls[-1] == "capture+replay"
    _train(call, model, x, 1)  # the replay's backward has not run: eager
    assert call.calls[-1] == "eager"


def test_a_model_gpu_bound_but_while_recorded_is_timed_more_then_left_eager(fresh, cpu_streams, monkeypatch):
    """As a step: the RECORD calls say nothing (the recorder slowed the host), so the CAPTURE call runs one
    more timed warmup call each time until GPU_BOUND_CALLS unrecorded ones were GPU-bound; no capture."""

    class Timing(Measured):
        def __init__(self, stream):
            super().__init__(12.0, 2.0)
            fresh.log.append("timed")

        def stop(self):  # after the call: a RECORD call's host was slowed
            if fresh.recorded:
                self.measured, fresh.recorded = (12.0, 12.0), False

    fresh.recorded = False
    compared = TracedModule._compared

    def recording(self, *args, **kwargs):
        fresh.recorded = True
        return compared(self, *args, **kwargs)

    monkeypatch.setattr(graphed_module_module, "Timing", Timing)
    monkeypatch.setattr(TracedModule, "_compared", recording)
    model = Clocked(fresh)
    call = TracedModule(model, fresh)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(call, model, torch.randn(8, 4), 8)
    assert call.calls == MODEL_WARMUP_LOG + ["timed", "timed", "eager", "eager"]
    messages = [str(w.message) for w in caught if issubclass(w.category, GraphifyFallbackWarning)]
    assert len(messages) == 1 and "no gain expected: GPU-bound (its forward pass" in messages[0]
    assert call.state["graphed"] is None and call.state.disabled is not None


@pytest.mark.parametrize("wrap", [lambda: CapturedStep(_double), lambda: GraphedModule(torch.nn.Linear(2, 2))], ids=["step", "model"])
def test_giving_up_leaves_no_frame_for_the_garbage_collector(wrap):
    """The warning is shown at the caller's line, found by walking the frames: a frame left in a reference
    cycle would keep its callers' locals (tensors) until a collection, which in a DataLoader worker forked
    meanwhile, touching CUDA tensors, aborts (tests/gpu/test_graphed_module_gpu.py runs it on CUDA)."""

    def loop():
        batch = torch.ones(3)  # noqa: F841 - a local of the caller's frame
        wrapped._give_up("a reason")

    wrapped = wrap()
    gc.collect()
    gc.disable()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loop()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if torch.is_tensor(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not left and len(caught) == 1 and caught[0].lineno == loop.__code__.co_firstlineno + 2


def test_dropped_graphs_wait_for_a_fork_unless_they_hold_much_memory():
    """A full collection costs more than a short loop gains: small dropped graphs are collected right
    before the next fork (a DataLoader worker must not inherit them) or by Python's own collection; large
    ones at once."""
    import gc
    import weakref

    from graphify.runtime import common

    class Cycle:
        pass

    def dropped():
        node = Cycle()
        node.me = node
        return weakref.ref(node)

    gc.collect()
    gc.disable()
    try:
        small = dropped()
        common.free_dropped_graphs(1024)
        assert small() is not None  # waits
        common._collect_before_fork()
        assert small() is None
        large = dropped()
        common.free_dropped_graphs(common.LARGE_DROPPED_GRAPHS)
        assert large() is None
    finally:
        gc.enable()


# ---- what each replay still checks ---------------------------------------------------------------


class Watched(Traced):
    """A Traced step whose capture keeps the gradient bookkeeping of a real one (gradients.GradientWatch)."""

    def _record_graph(self, key, device, inputs):
        watch = GradientWatch([p for m in self.state.modules for p in m.parameters()])
        try:
            captured, failure = super()._record_graph(key, device, inputs)
        finally:
            watch.close()
        return dataclasses.replace(captured, gradients=watch.gradients()), failure


def _replaying_model_step(fresh, monkeypatch):
    """A training step of a small model, replaying: (the step, its model, an input)."""
    monkeypatch.setenv("GRAPHIFY_CAPTURE", "always")
    monkeypatch.setenv("GRAPHIFY_HOST_CHECK", "off")  # on the CPU every small tensor is a host value
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.0), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step, x = Watched(_sgd_step(model, optimizer), fresh), torch.randn(8, 4)
    assert run(step, 5, x) == (["eager"] * 3 + ["capture+replay", "replay"], [])
    return step, model, x


def _mode_by_attribute(model):
    model[1].training = False  # not through eval(): no method of the module runs


def _frozen_by_attribute(model):
    model[0].bias.requires_grad = False


@pytest.mark.parametrize(
    "change",
    [_mode_by_attribute, lambda model: model.eval(), _frozen_by_attribute, lambda model: model[2].requires_grad_(False)],
    ids=["mode-by-attribute", "eval", "requires-grad-by-attribute", "requires-grad-method"],
)
def test_a_mode_or_a_frozen_parameter_changed_between_replays_is_another_graph(fresh, monkeypatch, change):
    """The modes and which parameters require grad are read at every call, however they were set: the
    changed step warms up as a key of its own, and changed back it replays its first graph again."""
    step, model, x = _replaying_model_step(fresh, monkeypatch)
    before = ([m.training for m in model.modules()], [p.requires_grad for p in model.parameters()])
    change(model)
    assert run(step, 1, x) == (["eager"], [])
    for m, mode in zip(model.modules(), before[0]):
        m.training = mode
    for p, wanted in zip(model.parameters(), before[1]):
        p.requires_grad = wanted
    assert run(step, 1, x) == (["replay"], [])


def test_gradients_unset_or_replaced_between_replays_point_at_the_graphs_again(fresh, monkeypatch):
    """`.grad` set to None or to another tensor between replays (eager code, a zero_grad outside the step)
    is put back where the graph leaves it before the next replay."""
    step, model, x = _replaying_model_step(fresh, monkeypatch)
    weight, bias = model[0].weight, model[0].bias
    left = weight.grad, bias.grad
    weight.grad, bias.grad = None, torch.zeros_like(bias)
    assert run(step, 1, x) == (["replay"], [])
    assert weight.grad is left[0] and bias.grad is left[1]


@pytest.mark.parametrize(
    "other",
    [torch.ones(4, 3), torch.ones(3, dtype=torch.float64), torch.ones(3, device="meta")],
    ids=["shape", "dtype", "device"],
)
def test_an_input_of_another_shape_dtype_or_device_runs_eagerly_between_replays(fresh, monkeypatch, other):
    monkeypatch.setenv("GRAPHIFY_CAPTURE", "always")
    step, x = Traced(_double, fresh), torch.ones(3)
    run(step, 5, x)
    assert run(step, 3, x)[0] == ["replay"] * 3
    assert run(step, 1, other)[0] == ["eager"] and run(step, 1, x)[0] == ["replay"]


def periodic_checks(state: KeyState, replays: int, seconds_each: float, clock_now: list) -> list[int]:
    """The replays, of `replays` more, that run recorded as periodic checks, each replay taking
    `seconds_each` on the clock and each check costing what `state.check_cost` says."""
    checked = []
    for _ in range(replays):
        clock_now[0] += seconds_each
        check, _ = state.count_replay(recorded=True)
        if check:
            checked.append(state.replays)
            state.start_check(False)
            cost = state.check_cost
            with state.recording():
                clock_now[0] += cost
    return checked


def test_periodic_checks_double_and_wait_until_they_cost_a_small_share_of_the_run(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(states, "clock", lambda: now[0])
    cheap = KeyState(graph=object())
    assert periodic_checks(cheap, 1100, 0.01, now) == [128, 256, 512, 1024]  # a check costing nothing: as it was
    dear = KeyState(graph=object(), check_cost=1.0)  # a check costs 1 s, a replay 10 ms: 100 replays each
    checks = periodic_checks(dear, 21000, 0.01, now)
    assert abs(checks[0] - 1 / states.MAX_CHECK_SHARE / 0.01) <= 2  # the loop ran 50 s (50 checks' cost) first
    assert all(b >= 2 * a and (b - a) * 0.01 >= 1 / states.MAX_CHECK_SHARE for a, b in zip(checks, checks[1:]))
    assert len(checks) >= 3
    # a check on entering the loop again does not wait for time
    dear.recheck = True  # many replays since the last check on entering
    assert dear.count_replay(recorded=True) == (True, True)
