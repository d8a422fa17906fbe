"""graphify.runtime on the CPU: nested inputs and outputs, the re-entry registry, the eager path, and
the decisions taken from timings (given here, as the CUDA events would measure them)."""

import collections
import dataclasses
import warnings

import pytest
import torch

from graphify.runtime import CapturedStep, GraphedModule, copy_outputs
from graphify.runtime.common import input_fit, split, tree_map
from graphify.runtime.reach import inner_optimizers, referenced, why_not_capturable

Pair = collections.namedtuple("Pair", "x y")


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    loss: torch.Tensor
    note: str = "kept"


class MappingOutput(collections.OrderedDict):
    """Like transformers' ModelOutput: a dict subclass built from keywords."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)


def test_tree_map_keeps_every_container_type():
    t = torch.ones(2)
    value = (Pair(t, [t, {"a": t}]), Output(t, t), MappingOutput(loss=t), "host", 3)
    doubled = tree_map(lambda x: x * 2, value)
    assert type(doubled[0]) is Pair and isinstance(doubled[0].y, list) and isinstance(doubled[0].y[1], dict)
    assert type(doubled[1]) is Output and doubled[1].note == "kept"
    assert type(doubled[2]) is MappingOutput
    assert doubled[3:] == ("host", 3)
    assert torch.equal(doubled[1].loss, t * 2) and torch.equal(doubled[0].y[1]["a"], t * 2)


def test_copy_outputs_is_a_deep_copy_of_tensors():
    t = torch.zeros(3)
    copied = copy_outputs({"loss": t, "parts": (t,)})
    t.add_(1)
    assert copied["loss"].sum() == 0 and copied["parts"][0].sum() == 0


def test_split_separates_tensors_from_host_values():
    t = torch.ones(1)
    tensors, host = split((t, 0.5, Pair(t, 2), {"k": t}))
    assert len(tensors) == 3 and host == (0.5, 2, "k")
    # NumPy scalars key graphs by value: two equal ones are the same key, whatever their identity
    import numpy as np

    one, other = np.float32(0.25), np.float32(0.25)
    assert one is not other and split((one,))[1] == split((other,))[1] == (0.25,)


class _Marked(torch.Tensor):
    """A tensor subclass, as a library might hand in."""


@pytest.mark.parametrize(
    ("make", "fits"),
    [
        (lambda x, y: [x.clone(), y.clone()], True),
        (lambda x, y: [x.t().contiguous().t(), y], True),  # another stride: the plain comparison
        (lambda x, y: [x.clone().requires_grad_(), y], True),
        (lambda x, y: [x.as_subclass(_Marked), y], True),
        (lambda x, y: [x[:4], y[:4]], False),
        (lambda x, y: [x.double(), y], False),
        (lambda x, y: [x], False),
        (lambda x, y: [x, y, y], False),
        (lambda x, y: [x.to("meta"), y], False),
    ],
)
def test_an_input_fits_the_static_buffers_by_shape_dtype_and_device_alone(make, fits):
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    assert input_fit([x, y])(make(x, y)) is fits


def test_static_buffers_of_a_subclass_are_fitted_by_the_plain_comparison():
    statics = [torch.randn(8, 6).as_subclass(_Marked)]
    assert input_fit(statics)([torch.randn(8, 6)]) and not input_fit(statics)([torch.randn(4, 6)])


def test_an_object_input_keys_by_identity_and_its_id_is_not_reused_while_keyed():
    # a criterion rebuilt each epoch: the freed one's id must not match a later one's key
    first = torch.nn.CrossEntropyLoss()
    key = split((first,))[1]
    assert split((first,))[1] == key
    del first
    later = [torch.nn.CrossEntropyLoss() for _ in range(200)]
    assert all(split((criterion,))[1] != key for criterion in later)


def test_the_step_runs_eagerly_off_cuda():
    calls = []

    def step(x):
        calls.append(1)
        return x + 1

    captured = CapturedStep(step)
    for _ in range(6):
        assert torch.equal(captured(torch.zeros(2)), torch.ones(2))
    assert len(calls) == 6 and not captured.state.graphs


def _make_epoch_step(model, opt):
    def train_step(x):
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    return CapturedStep(train_step)


def test_a_reentered_loop_finds_its_captures_when_it_uses_the_same_objects():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first, second = _make_epoch_step(model, opt), _make_epoch_step(model, opt)
    assert first.state is second.state  # the second epoch's helper shares the first one's graphs
    other = _make_epoch_step(torch.nn.Linear(2, 1), opt)
    assert other.state is not first.state  # another model: captured again


def test_what_the_step_uses_is_found_through_closures_and_attributes():
    class Trainer:
        def __init__(self):
            self.policy = torch.nn.Module()
            self.policy.q_net = torch.nn.Linear(2, 2)
            self.optimizer = torch.optim.Adam(self.policy.q_net.parameters())

    trainer = Trainer()

    def step():
        return trainer.policy.q_net(torch.ones(2))

    objects = referenced(step)
    assert trainer.optimizer in objects and trainer.policy in objects
    assert why_not_capturable(objects, [trainer.optimizer]) is None
    lbfgs = torch.optim.LBFGS(trainer.policy.parameters())
    assert "LBFGS" in why_not_capturable(objects, [lbfgs])


class _GradientState:
    def __init__(self, num_steps):
        self.num_steps = num_steps


def _accelerated(optimizer, scaler=None, num_steps=1):
    """An optimizer wrapped as Accelerate wraps it (the class lives in an `accelerate` module)."""
    wrapper = type("AcceleratedOptimizer", (torch.optim.Optimizer,), {"__module__": "accelerate.optimizer"})
    wrapped = wrapper.__new__(wrapper)
    wrapped.__dict__.update(optimizer=optimizer, scaler=scaler, gradient_state=_GradientState(num_steps))
    return wrapped


def test_accelerate_optimizers_are_stepped_through_their_inner_optimizer():
    adam = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    assert inner_optimizers([_accelerated(adam), adam]) == ([adam], None)
    _, why = inner_optimizers([_accelerated(adam, scaler=object())])
    assert "gradient scaler" in why
    _, why = inner_optimizers([_accelerated(adam, num_steps=4)])
    assert "accumulates" in why


def test_a_wrapped_model_is_found():
    """DataParallel over several GPUs replicates the module every step; on one GPU it calls the module."""
    model = torch.nn.DataParallel(torch.nn.Linear(2, 2))
    model.device_ids = [0, 1]
    assert "DataParallel" in why_not_capturable([model], [])
    model.device_ids = [0]
    assert why_not_capturable([model], []) is None


def test_graphed_module_is_eager_off_cuda():
    model = torch.nn.Linear(2, 2)
    graphed = GraphedModule(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = graphed(torch.ones(1, 2))
    assert torch.equal(out, model(torch.ones(1, 2)))


def test_a_setting_that_keeps_changing_leaves_the_step_eager():
    """SGD's float learning rate moved by a scheduler: the graphs are dropped and captured again; moved
    within a few replays of each capture more than MAX_KEYS times, the step stays eager with one warning."""
    from graphify.runtime.captured_step import FEW_REPLAYS, MAX_KEYS

    captured = CapturedStep(lambda x: x)
    state = captured.state
    entry = state.entry("key")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(MAX_KEYS):
            entry.graph, entry.replays = object(), entry.replays + FEW_REPLAYS - 1
            captured._forget_graphs(warm=True)
        assert state.graphs == {} and state.disabled is None and not caught
        captured._forget_graphs(warm=True)
    assert "changed within 32 replays of its capture more than 16 times" in state.disabled and len(caught) == 1


def test_a_setting_moved_once_an_epoch_is_followed_for_any_number_of_epochs():
    """A per-epoch schedule: each capture replayed for an epoch paid for itself; the warmup and the replay
    counts (the check schedule) carry over, so the next call captures at once."""
    from graphify.runtime.captured_step import FEW_REPLAYS, MAX_KEYS

    captured = CapturedStep(lambda x: x)
    state = captured.state
    entry = state.entry("key")
    entry.eager_runs = 4
    for _ in range(3 * MAX_KEYS):
        entry.graph, entry.replays = object(), entry.replays + FEW_REPLAYS
        captured._forget_graphs(warm=True)
    assert state.disabled is None and state.recaptures == 3 * MAX_KEYS and state.hasty_recaptures == 0
    assert entry.eager_runs == 4 and entry.replays == 3 * MAX_KEYS * FEW_REPLAYS and entry.graph is None
    captured._forget_graphs()  # a host value moved: warm up and count again
    assert entry.eager_runs == 0 and entry.replays == 0 and state.replays_at_forget == 0


class _Timed:
    """A Timing whose measurement is given, (GPU ms, host ms), and read at once."""

    def __init__(self, gpu_ms, host_ms):
        self.measured = (gpu_ms, host_ms)

    def done(self):
        return True

    def milliseconds(self):
        return self.measured


def _load(*samples, recorded=0):
    """A WarmupLoad of timed warmup calls, (GPU ms, host ms) each, the first `recorded` of them recorded."""
    from graphify.runtime.common import WarmupLoad

    load = WarmupLoad()
    for i, sample in enumerate(samples):
        load.add(_Timed(*sample), recorded=i < recorded)
    return load


def test_work_is_gpu_bound_when_the_host_takes_under_half_the_gpu_time():
    from graphify.runtime.common import gpu_bound

    assert gpu_bound(12.0, 2.0, "a step", 3) == (
        "no gain expected: GPU-bound (a step keeps the GPU busy 12.0 ms for 2.0 ms of host time, "
        "medians of 3 warmup calls each under 50%; GRAPHIFY_CAPTURE=always captures it anyway)"
    )


def test_graphs_are_kept_only_when_replays_are_clearly_faster():
    from graphify.runtime.graphed_module import MIN_REPLAY_GAIN, slower_replays

    assert slower_replays(0.60, 0.20) is None
    assert slower_replays(MIN_REPLAY_GAIN * 0.20, 0.20) is None
    assert slower_replays(0.21, 0.20).startswith(
        "no gain expected: a replayed forward and backward took 0.20 ms, an eager one 0.21 ms (graphs are kept from 1.1x faster"
    )
    assert slower_replays(0.20, 0.35) is not None


def test_a_gpu_bound_step_stays_eager_with_one_warning(monkeypatch):
    """The timed warmup calls decide once; GRAPHIFY_CAPTURE=always captures whatever they measured."""
    step = CapturedStep(lambda x: x + 1)
    step.state.load = _load((12.0, 2.0), (12.0, 2.0), (12.0, 2.0), recorded=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert step._load_verdict("a step") == "eager"
        assert step.state.load is None and step._load_verdict("a step") == "capture"  # decided once: EAGER wins in _run
    assert [str(w.message) for w in caught] == [
        f"graphify: `test_a_gpu_bound_step_stays_eager_with_one_warning.<locals>.<lambda>` runs eagerly: {step.state.disabled}"
    ]
    assert step.state.disabled.startswith("no gain expected: GPU-bound (a step keeps the GPU busy 12.0 ms for 2.0 ms")
    forced = CapturedStep(lambda x: x + 2)
    forced.state.load = _load((12.0, 2.0), (12.0, 2.0), (12.0, 2.0))
    monkeypatch.setenv("GRAPHIFY_CAPTURE", "always")
    assert forced._load_verdict("a step") == "capture" and forced.state.disabled is None


def test_a_gpu_bound_forward_leaves_the_model_eager_without_capturing(monkeypatch):
    model = torch.nn.Linear(2, 2)
    graphed = GraphedModule(model)
    graphed.state.load = _load((8.0, 0.5), (8.0, 0.5), (8.0, 0.5))
    monkeypatch.setattr(GraphedModule, "_graph", lambda *_: pytest.fail("a GPU-bound forward must not be captured"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert graphed._capture("signature", (torch.ones(1, 2),), {}) == "eager"
    assert [str(w.message) for w in caught] == [f"graphify: the model runs eagerly: {graphed.state['disabled']}"]
    assert graphed.state["disabled"].startswith("no gain expected: GPU-bound (its forward pass keeps the GPU busy 8.0 ms for 0.5 ms")
    assert graphed.state["graphed"] is None
    out = graphed(torch.ones(1, 2))  # eager for good, whatever the device
    assert torch.equal(out, model(torch.ones(1, 2)))


def test_graphify_capture_always_graphs_a_gpu_bound_forward(monkeypatch):
    graphed = GraphedModule(torch.nn.Linear(2, 2))
    graphed.state.load = _load((8.0, 0.5), (8.0, 0.5), (8.0, 0.5))
    monkeypatch.setenv("GRAPHIFY_CAPTURE", "always")
    monkeypatch.setattr(GraphedModule, "_graph", lambda *_: None)  # the capture itself needs CUDA
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert graphed._capture("signature", (torch.ones(1, 2),), {}) == "captured"
    assert graphed.state["disabled"] is None


def test_the_fastest_timed_passes_decide_and_leave_gradients_alone(monkeypatch):
    """Eager and replayed passes alternate; the untimed first of each is left out, the fastest of the
    rest counts, and the backward passes write no `.grad`. A fake clock stands for the CUDA events."""
    from graphify.runtime import graphed_module

    ticks = iter(range(100))

    class Clocked:
        def __init__(self, stream):
            self.tick = next(ticks)

        def stop(self):
            pass

        def milliseconds(self):
            return float(self.tick), 0.0

    monkeypatch.setattr(graphed_module, "Timing", Clocked)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: None)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model[0].weight.grad = torch.ones_like(model[0].weight)
    replays = []
    graphed = GraphedModule(model)
    trained = list(model.parameters())
    timed = graphed._time_passes(lambda x, *params: replays.append(params) or model(x), (torch.randn(5, 3),), {}, trained)
    assert timed == (2.0, 3.0)  # eager ticks 0 (untimed), 2, 4, 6; replayed ticks 1 (untimed), 3, 5, 7
    assert len(replays) == 1 + graphed_module.TIMED_PASSES
    assert all(len(params) == len(trained) and all(a is b for a, b in zip(params, trained)) for params in replays)
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight)) and model[0].bias.grad is None


def test_micro_step_batches_are_fetched_in_pass_order_off_cuda():
    log = []

    def fetch():
        log.append("fetch")
        return torch.ones(2)

    def train_step(batches):
        for micro in range(3):
            log.append(f"pass {micro}")
            batches[micro].sum()

    step = CapturedStep(train_step)
    step(step.fetch(fetch, 3))
    assert log == ["pass 0", "fetch", "pass 1", "fetch", "pass 2", "fetch"]  # each when its pass reads it


def test_fetched_batches_are_fetched_once_each_and_all_on_demand():
    counter = iter(range(10))
    fetched = CapturedStep.fetch(lambda: next(counter), 3)
    assert fetched[1] == 1 and fetched[0] == 0 and len(fetched) == 3
    assert fetched.fetch_all() == [0, 1, 2]
    assert next(counter) == 3


def test_a_model_wrapped_across_processes_is_not_graphed_alone(monkeypatch):
    """DDP and FSDP reduce gradients from hooks in the backward: such a model stays eager, with one warning."""

    class FullyShardedDataParallel(torch.nn.Module):  # stands for the wrapper: only its class name is read
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, x):
            return self.module(x)

    graphed = GraphedModule(FullyShardedDataParallel(torch.nn.Linear(2, 2)))
    monkeypatch.setattr(GraphedModule, "_graph", lambda *_: pytest.fail("a wrapped model must not be captured"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert graphed._capture("signature", (torch.ones(1, 2),), {}) == "eager"
    assert len(caught) == 1 and "its FullyShardedDataParallel wrapper reduces gradients from hooks" in str(caught[0].message)


def test_a_broken_capture_is_reported_by_the_error_that_broke_it():
    """Ending a broken capture raises a vague error whose context is the precise one; a default-stream
    gradient accumulator kept alive by the user's code gets a hint the user can act on."""
    from graphify.runtime.common import capture_failure

    def broken(first: Exception) -> Exception:
        try:
            try:
                raise first
            except Exception:
                raise RuntimeError("CUDA error: operation failed due to a previous error during capture\nmore") from None
        except RuntimeError as exc:
            exc.__context__ = first
            return exc

    kept = capture_failure(broken(RuntimeError("CUDA error: operation would make the legacy stream depend on a capturing blocking stream")))
    assert kept.startswith("capture failed (RuntimeError: CUDA error: operation would make the legacy stream depend")
    assert "torch.no_grad()" in kept
    other = capture_failure(broken(ValueError("bad shape")))
    assert other == "capture failed (ValueError: bad shape)"
    assert capture_failure(TypeError("plain\nsecond line")) == "capture failed (TypeError: plain)"
    try:
        try:
            raise RuntimeError("operation not permitted when stream is capturing")
        except RuntimeError as inner:
            raise LookupError("The function that was compiled for this operation failed to execute.") from inner
    except LookupError as wrapped:
        assert capture_failure(wrapped) == "capture failed (RuntimeError: operation not permitted when stream is capturing)"


def test_an_in_place_change_is_told_by_the_version_counters():
    from graphify.runtime.common import changed_in_place, versions

    a, b = torch.zeros(3), torch.zeros(3)
    before = versions([a, b])
    b.add_(1)
    assert changed_in_place([a, b], before) == (1,)
    with torch.inference_mode():
        c = torch.zeros(3)
    assert versions([c]) == [None] and changed_in_place([c], [None]) == ()


def test_tensors_replaced_by_a_checkpoint_load_are_told_by_their_addresses():
    """`model.load_state_dict` copies into the parameters; `optimizer.load_state_dict` makes new state
    tensors, which a graph captured before would not touch."""
    import copy

    from graphify.runtime.reach import tensor_addresses

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    saved_model, saved_optimizer = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    before = tensor_addresses([model], [optimizer])
    model.load_state_dict(saved_model)
    assert tensor_addresses([model], [optimizer]) == before
    optimizer.load_state_dict(saved_optimizer)
    assert tensor_addresses([model], [optimizer]) != before


def test_the_modes_a_step_sets_itself_are_told_from_those_it_was_called_with():
    """`model.train()` inside a captured step: replays skip it, so CapturedStep sets what it set at capture."""
    from graphify.runtime.captured_step import modes_changed

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    submodules = list(model.modules())
    model.eval()
    before = bytes(m.training for m in submodules)
    model.train()
    assert modes_changed(submodules, before) == [(m, True) for m in submodules]
    assert modes_changed(submodules, bytes(m.training for m in submodules)) == []


def test_a_graphed_model_answers_attribute_reads_as_its_model():
    """The rewrite hands a helper the graphed model in place of the model: `model.train()`, `model.eval()`,
    `model.parameters()` and plain attributes there are the module's own."""
    import torch

    from graphify.runtime import GraphedModule

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))
    graphed = GraphedModule(model)
    assert graphed.eval() is model and not model.training
    assert graphed.train() is model and model.training and graphed.training
    assert list(graphed.parameters()) == list(model.parameters())
    assert graphed._modules["0"] is model[0]
    with pytest.raises(AttributeError):
        graphed.no_such_attribute
