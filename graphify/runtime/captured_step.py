"""CapturedStep: a whole training or inference step, warmed up, captured and replayed, through the phases
of states.py; StepState, what it keeps for a step across calls and re-entries of its loop."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from graphify.runtime.common import (
    WARMUP,
    Fetched,
    Identity,
    LoopTrial,
    TENSOR_TYPE,
    Timing,
    capture_failure,
    capture_forced,
    changed_in_place,
    collection_paused,
    copy_outputs,
    input_fit,
    leaves,
    requires_grad,
    restore_host_state,
    save_host_state,
    side_stream,
    split,
    is_training,
    trial_event,
    tree_map,
    versions,
)
from graphify.runtime.distributed import DDP_WARMUP, all_ranks_agree, ddp_modules, free_before_teardown, holds_collectives
from graphify.runtime.gradients import GradientWatch, GraphGradients
from graphify.runtime.host_values import HostValues, compiled, drift_reason, first_difference, recording_allowed
from graphify.runtime.optimizer_settings import give_back, make_capturable, moved_settings, use_tensor_lrs
from graphify.runtime.reach import bindings, inner_optimizers, referenced, registrations, same, watch_registrations, why_not_capturable
from graphify.runtime.staging import staged_copy
from graphify.runtime.states import GraphStates, Phase, Wrapper, registry

MAX_KEYS = 16  # graphs (and warmups) per step: beyond, a host value changes every step and the step stays eager
FEW_REPLAYS = 32  # a graph dropped after fewer replays did not pay for its capture
KEPT_PER_STEP = 4  # states kept per step function: e.g. one train() function called in turn for a few models
_CAPTURE_AGAIN = object()  # a replay found a value its graph froze moved, and dropped the graphs: the call starts over
_is_cuda = operator.attrgetter("is_cuda")


@dataclass(eq=False)
class CapturedGraph:
    """One graph of a step, with what its replays need."""

    graph: torch.cuda.CUDAGraph
    statics: list  # static input tensors, copied into before each replay
    outputs: object  # static outputs, which the next replay overwrites
    gradients: GraphGradients  # what each replay starts `.grad` from
    changed: tuple  # indexes of the inputs the step changes in place: copied back after each replay
    modes_set: list  # (module, training) the step's own mode calls set: set again after each replay
    fits: Callable = field(init=False)  # whether inputs have the statics' shapes, dtypes and devices (input_fit)

    def __post_init__(self):
        self.fits = input_fit(self.statics)


@dataclass(eq=False)
class StepState(GraphStates):
    """Everything a CapturedStep keeps for one step function and the objects it refers to: its keys (states.
    KeyState), what it was found to use, what its graphs froze of the optimizers, and its recaptures."""

    bindings: tuple = ()  # what the step's free names refer to (reach.bindings): the same objects, the same graphs
    inspected: bool = False  # what the step uses was found, at its first call on CUDA
    modules: list = field(default_factory=list)  # the top-level modules the step reaches
    optimizers: list = field(default_factory=list)  # the torch optimizers it steps
    handed: list = field(default_factory=list)  # models and optimizers handed to the first call as arguments
    submodules: list = field(default_factory=list)  # of `modules`: train/eval modes are part of each key
    parameters: list = field(default_factory=list)  # theirs: which require grad is part of each key (freezing, unfreezing)
    ddps: list = field(default_factory=list)  # DistributedDataParallel models: longer warmup, ranks agree on captures
    made_capturable: list = field(default_factory=list)  # (optimizer, group) set capturable: given back if it stays eager
    side_stream_used: bool = False
    pool: object = None  # the graphs' memory pool
    lr_tensors: list = field(default_factory=list)  # [param group, device tensor, float it holds]
    frozen: list = field(default_factory=list)  # of each param group, the settings the graph cannot follow (use_tensor_lrs)
    group_counts: list = field(default_factory=list)  # (optimizer, its param groups at capture): a group added later is not in the graph
    # times the graphs were dropped because a value they froze changed; of those, how many within FEW_REPLAYS
    # replays of the last; the replays of all keys then
    recaptures: int = 0
    hasty_recaptures: int = 0
    replays_at_forget: int = 0
    fetch_checks: int | None = None  # eager calls that fetched micro-step batches in order; -1 off CUDA
    tried: bool = False  # whether replays were put on trial against eager calls in the loop (common.LoopTrial)

    def captured_on(self) -> tuple[list, list]:
        return self.modules, self.optimizers

    def stop(self, why: str) -> None:
        super().stop(why)
        self.pool = None

    def follow_no_settings(self) -> None:
        """The graphs are gone: no learning rate or setting they froze is followed any more."""
        self.lr_tensors, self.frozen, self.group_counts = [], [], []


class CapturedStep(Wrapper):
    """Runs one training (or inference) step from a CUDA graph.

    Each key (host branch outcomes such as "the optimizer steps this time", the modes of the modules and
    their submodules, whether grad is enabled) goes through the phases of states.py: the first `warmup`
    calls on CUDA run eagerly on a side stream (WARMUP), two of them recording the host values handed to
    the operators (RECORD, one call more: they must agree, or the step stays eager) and all but the first
    timed (TIMED: a GPU-bound step is not captured); the next call copies its inputs into static buffers,
    captures the step and replays it (CAPTURE); later calls copy their inputs in and replay (CAPTURED). Inputs of another shape, dtype or
    device and calls off CUDA run eagerly; a call after a setting the graph froze has changed (a float
    learning rate on an optimizer that cannot read a tensor one, betas, momentum or eps moved, a param
    group added) captures again at once; a replay run recorded (see _rechecked) that shows a host value
    moved, or a module changed since the capture (pruned: reach.layout), makes the step warm up and capture
    again. Before a replay, `.grad` is put where the graph adds into it and leaves it (gradients.GraphGradients).
    A replay returns the graph's static outputs, which the next replay overwrites: `copy_outputs` keeps them.
    """

    def __init__(self, step, device=None, warmup: int = WARMUP):
        self.step = step
        self.device = torch.device(device) if device is not None else None
        self.warmup = warmup
        watch_registrations()
        bound = bindings(step)
        self.state, new = registry.step_state(
            step.__code__, lambda s: same(s.bindings, bound), lambda: StepState(bindings=bound), KEPT_PER_STEP
        )
        if not new:
            self.state.entered_again()
        if self.state.guard(always=True) is not None:
            self._forget_graphs()  # e.g. the optimizer's state loaded from the best epoch's checkpoint

    copy = staticmethod(copy_outputs)
    stage = staticmethod(staged_copy)  # `x = train_step.stage(x, device)`: the batch's copy waits for no replay before it (staging.py)
    fetch = staticmethod(Fetched)  # `train_step.fetch(lambda: next(loader), k)`: the batches of k micro-steps

    @property
    def subject(self) -> str:
        return f"`{getattr(self.step, '__qualname__', 'step')}`"

    def __call__(self, *inputs, key=()):
        if all(map(isinstance, inputs, TENSOR_TYPE)) and self.device is None:  # the usual call: tensors alone
            tensors, host = list(inputs), ()
        else:
            tensors, host, inputs = self._inputs(inputs)
            if tensors is None:
                return self._fetch_in_order(inputs)
        if not self._on_cuda(tensors):
            return self.step(*inputs)  # the step as written
        handed = self._admit(host)
        if self.state.guard() is not None:  # pruned since the capture, say: a new mask buffer and forward pre-hook
            self._forget_graphs()
        result = self._run(key, host, handed, tensors, inputs)
        if result is _CAPTURE_AGAIN:  # its graphs were dropped: this call warms up or captures
            result = self._run(key, host, handed, tensors, inputs)
        return result

    def _inputs(self, inputs: tuple) -> tuple:
        """(tensors, host values, inputs) of a call with other inputs than tensors, or moved to `device`;
        tensors None when batches made by `fetch` must come in order (the step runs as written)."""
        if Fetched in map(type, inputs):  # made by `fetch` alone
            if not self._fetch_ahead():
                return None, (), inputs
            inputs = tuple(x.fetch_all() if isinstance(x, Fetched) else x for x in inputs)
        if self.device is not None and self.device.type == "cuda":
            inputs = tree_map(lambda t: t.to(self.device, non_blocking=True), inputs)
        return (*split(inputs), inputs)

    def _run(self, key, host, handed, tensors, inputs):
        """This call, in the phase of its key."""
        state = self.state
        if state.disabled is not None:  # EAGER
            return self._eager(tensors, inputs) if state.side_stream_used else self.step(*inputs)
        key = self._key(key, host, handed)
        entry = state.keys.get(key)
        if entry is not None and entry.graph is not None:  # CAPTURED
            return self._replayed(key, entry, tensors, inputs)
        phase = state.phase_of(entry, self._warmup())
        if phase is Phase.CAPTURE:
            verdict = self._load_verdict("a step")  # GPU-bound: eager for good, before any capture
            return self._capture(key, tensors, inputs) if verdict == "capture" else self._eager(tensors, inputs, timed=verdict == "time")
        return self._warm(phase, key, tensors, inputs)

    def _key(self, key, host, handed) -> tuple:
        """What a graph is valid for: the rewrite's `key` (host branch outcomes), the host inputs, whether grad
        is enabled, and the modes of the modules and which parameters require grad."""
        state = self.state
        modes = bytes(map(is_training, state.submodules)), bytes(map(requires_grad, state.parameters))
        if handed:  # a model handed in (one of an ensemble): its identity is in the key, its modes too
            modes += (bytes(m.training for h in handed if isinstance(h, torch.nn.Module) for m in h.modules()),)
        return key, host, torch.is_grad_enabled(), modes

    def _warmup(self) -> int:
        """Calls of a key before its capture: DDP's, or `warmup` and one more when the calls are recorded."""
        state = self.state
        return max(self.warmup, DDP_WARMUP) if state.ddps else self.warmup + bool(state.recorded)

    # ---- WARMUP, RECORD, TIMED ------------------------------------------------------------------

    def _warm(self, phase, key, tensors, inputs):
        """A warmup call: eager on the side stream; a RECORD call compares host values, a TIMED call is timed."""
        state = self.state
        runs = state.warm(key, MAX_KEYS)
        if runs is None:
            self._give_up(f"its host inputs or branch keys took more than {MAX_KEYS} values (a Python value that changes every step?)")
            return self._eager(tensors, inputs)
        timed = self._timed(runs)
        if phase is Phase.RECORD:
            return self._compared(key, tensors, inputs, first=runs == self._warmup() - 3, timed=timed)
        return self._eager(tensors, inputs, timed=timed)

    def _eager(self, tensors, inputs, timed: bool = False, recorded: bool = False):
        """An eager step on the side stream (as warmup must be, and so that autograd keeps one stream);
        `timed`: its host and GPU time are kept (`recorded`: the recorder ran in it), to tell a GPU-bound
        step before capturing it (common.WarmupLoad)."""
        device = tensors[0].device if tensors else self._param_device()
        self.state.side_stream_used = True
        stream = side_stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))  # the inputs' GPU: not the current one without set_device
        cache = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)  # cached casts would outlive a capture; values are the same
        try:
            with torch.cuda.stream(stream):
                timing = Timing(stream) if timed else None
                result = self.step(*inputs)
                if timing:
                    timing.stop()
                    self.state.load.add(timing, recorded)
                return result
        finally:
            torch.set_autocast_cache_enabled(cache)
            torch.cuda.current_stream(device).wait_stream(stream)

    def _compared(self, key, tensors, inputs, first: bool, timed: bool = False):
        """A RECORD call: records the host values the step hands to the GPU, and compares them with the
        last recorded call of this key: any difference leaves the step eager for good, since a graph would
        replay the values it was captured with. (Only warmup calls: an eager call between replays would
        leave `.grad` pointing away from the graph's gradient buffers, which eager code after a replay, a
        GradScaler's step, reads.)"""
        state, entry = self.state, self.state.keys[key]
        counted = registrations()
        with entry.recording(), HostValues(state.optimizers) as record:
            result = self._eager(tensors, inputs, timed=timed, recorded=True)
        now = registrations()
        if state.registrations == counted == (now[0] - len(record.handles), now[1]):
            state.registrations = now  # the recorder's own optimizer hooks change no forward
        calls = [tuple((t.shape, t.dtype) for t in tensors), *record.calls]  # only calls on inputs of one shape compare
        before = None if first else entry.host_values
        difference = first_difference(before, calls) if before is not None and before[0] == calls[0] else None
        entry.host_values = calls
        if difference is not None:
            self._give_up(drift_reason(difference))
        return result

    # ---- CAPTURE --------------------------------------------------------------------------------

    def _capture(self, key, tensors, inputs):
        """The CAPTURE call: the graph recorded, then replayed once (capture records the step without running
        it: this replay trains on the batch). A failed capture leaves the step eager for good."""
        device = tensors[0].device if tensors else self._param_device()
        captured, failure = self._record_graph(key, device, inputs)
        if failure is not None:
            self._give_up(failure)
            return self._eager(tensors, inputs)
        self._keep(key, captured, device)
        captured.graph.replay()
        for i in captured.changed:
            tensors[i].copy_(captured.statics[i], non_blocking=True)
        return captured.outputs

    def _record_graph(self, key, device, inputs):
        """(the CapturedGraph of the step on copies of `inputs`, None), or (None, why the capture failed),
        the host state then as it was before (RNG states, `.grad`)."""
        state = self.state
        static_inputs = tree_map(torch.Tensor.clone, inputs)
        statics = leaves(static_inputs)
        before = versions(statics)
        trained = dict.fromkeys([*state.parameters, *(p for o in state.optimizers for g in o.param_groups for p in g["params"])])
        saved = save_host_state(trained, device)
        watch = GradientWatch(trained)
        graph = torch.cuda.CUDAGraph()
        outputs, failure = self._traced(graph, device, static_inputs, watch)
        if state.ddps:  # every rank takes part, whatever its own outcome
            agreed = all_ranks_agree(failure is None, state.ddps, device)
            if failure is None and not agreed:
                failure = "the capture failed on another rank (captured collectives must match on every rank)"
        if failure is not None:
            restore_host_state(saved)
            return None, failure
        changed = changed_in_place(statics, before)  # a forward that normalises its input in place, say
        modes_set = modes_changed(state.submodules, key[3][0])  # by the step's own mode calls, which replays skip
        return CapturedGraph(graph, statics, outputs, watch.gradients(), changed, modes_set), None

    def _traced(self, graph, device, static_inputs, watch):
        """The step run under capture into `graph`, the optimizers reading tensor learning rates: (its static
        outputs, None), or (None, why the capture failed)."""
        state = self.state
        swapped = use_tensor_lrs(state.optimizers, state.lr_tensors, state.frozen, state.group_counts)
        cache = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)
        try:
            with (
                collection_paused(),
                torch.cuda.graph(graph, pool=state.pool, stream=side_stream(device), capture_error_mode="thread_local"),
            ):
                outputs = self.step(*static_inputs)
        except Exception as exc:  # noqa: BLE001 - any failure of capture leaves the run eagerly, never stopped
            return None, capture_failure(exc)
        finally:
            torch.set_autocast_cache_enabled(cache)
            watch.close()
            for group, lr in swapped:  # the graph reads the tensors; the groups show floats again
                group["lr"] = lr
        return outputs, None

    def _keep(self, key, captured: CapturedGraph, device) -> None:
        """The key is CAPTURED: its graph kept, what it runs on recorded (reach.layout); a graph of DDP freed
        before its process group goes; the first capture of a step puts replays on trial in the loop."""
        state = self.state
        state.pool = captured.graph.pool()
        state.record_layout()
        state.entry(key).graph = captured
        if state.ddps:
            holds_collectives(captured.graph)
            if len(state.graphs) == 1:
                free_before_teardown(functools.partial(state.stop, "its process group was destroyed"))
        elif not state.tried and not capture_forced():  # DDP ranks would have to agree on each turn: not tried
            state.tried, state.trial = True, LoopTrial(event=trial_event(device))

    # ---- CAPTURED -------------------------------------------------------------------------------

    def _replayed(self, key, entry, tensors, inputs):
        """A CAPTURED call: a replay, or an eager call for inputs that do not fit the static buffers or in the
        loop trial's eager turns, or a replay run recorded and checked (_rechecked). A setting the graphs
        froze that moved, or gradients present that the graph would overwrite, drop them: _CAPTURE_AGAIN."""
        state, captured = self.state, entry.graph
        if (moved := moved_settings(state.group_counts, state.frozen)) is not None:  # SGD's LR moved by a per-epoch scheduler
            self._forget_graphs(warm=moved == "lr" and not state.ddps)
            return _CAPTURE_AGAIN
        if not captured.fits(tensors):
            return self._eager(tensors, inputs)
        if state.trial is not None and self._trial_turn("a step") == "eager":
            return self._eager(tensors, inputs)
        if not captured.gradients.ready():  # a gradient present where the graph makes its own: capture adding to it
            self._forget_graphs(warm=not state.ddps)
            return _CAPTURE_AGAIN
        checked, entered = entry.count_replay(state.recorded)
        if checked:
            return self._rechecked(key, tensors, inputs, entered)
        return self._replay(captured, tensors)

    def _replay(self, captured: CapturedGraph, tensors):
        """Copy the inputs in, follow a moved learning rate, replay; then what eager code would see changed."""
        for static, new in zip(captured.statics, tensors):
            static.copy_(new, non_blocking=True)
        for entry in self.state.lr_tensors:
            group, lr, value = entry
            if group["lr"] != value:  # the scheduler moved it: one small fill, outside the graph
                lr.fill_(group["lr"])
                entry[2] = group["lr"]
        captured.graph.replay()
        for i in captured.changed:  # inputs the step changes in place: the caller's tensors change, as in eager
            tensors[i].copy_(captured.statics[i], non_blocking=True)
        for module, training in captured.modes_set:  # `model.train()` in the step: replays set the flag, as eager would
            module.training = training
        return captured.outputs

    def _rechecked(self, key, tensors, inputs, entered: bool):
        """A replay run eagerly and recorded instead, against its warmup's record (states.KeyState.count_replay
        says which). A host value that moved since warmup (a per-epoch value set by code the source does not
        show) makes the step capture again with it; with one warning unless found on entering the loop
        (replays before may have used the old)."""
        state, entry = self.state, self.state.keys[key]
        stale = entry.start_check(entered)
        with entry.recording(), HostValues(state.optimizers) as record:
            result = self._eager(tensors, inputs)
        difference = first_difference(entry.host_values[1:], record.calls) if entry.host_values is not None else None
        moved = state.layout_moved()
        if difference is not None or moved is not None:
            if not entered:
                why = f"a host value the step hands to the GPU moved after the capture ({difference})" if difference else moved
                self._warn(f"{why}; up to {stale} replays before this call may have used the old value", "captured again")
            self._forget_graphs()
        return result

    def _forget_graphs(self, warm: bool = False) -> None:
        """A value the graphs froze has changed: capture again, at the next call after a learning rate
        (`warm`: the step's warmup and host-value record still hold: CAPTURE), after a new warmup otherwise
        (WARMUP). Values that change within FEW_REPLAYS replays of a capture, more than MAX_KEYS times,
        leave it eager."""
        state = self.state
        state.recaptures += 1
        replayed = sum(entry.replays for entry in state.keys.values())
        state.hasty_recaptures += replayed - state.replays_at_forget < FEW_REPLAYS
        for entry in state.keys.values():
            entry.forget(warm)
        state.pool = None
        if state.trial is not None:  # warmup and capture come before the next replayed call
            state.trial.restart()
        state.follow_no_settings()
        if not warm:
            self._survey()  # a module may have changed (pruning, a parametrization)
        state.replays_at_forget = replayed if warm else 0
        # a param group added since (progressive unfreezing) comes with the optimizer's defaults
        make_capturable(state.optimizers, state.made_capturable)
        if state.hasty_recaptures > MAX_KEYS:
            self._give_up(
                f"a value the graph reads as a constant (a learning rate, momentum, a host value) changed within {FEW_REPLAYS} replays of its capture more than {MAX_KEYS} times"
            )

    def _release(self) -> None:
        """Given up: the optimizers get back the settings they were built with (capturable arithmetic run
        eagerly is slower), unless another step still captures with them."""
        state = self.state
        state.lr_tensors, state.frozen = [], []
        give_back(state.made_capturable, registry.capturing_optimizers())

    # ---- the first calls: what the step uses --------------------------------------------------------

    def _admit(self, host) -> list:
        """The models and optimizers handed to the call as arguments. The first call on CUDA finds what the
        step uses; a later one handed another optimizer leaves it eager."""
        state = self.state
        if not host and state.inspected:  # the usual call: nothing handed, nothing to check
            return []
        handed = [h.obj for h in host if isinstance(h, Identity) and isinstance(h.obj, (torch.nn.Module, torch.optim.Optimizer))]
        if not state.inspected:
            self._inspect(handed)
        elif state.disabled is None and any(isinstance(o, torch.optim.Optimizer) and all(o is not k for k in state.handed) for o in handed):
            self._give_up("it is handed an optimizer other than its first call's (a new one per fold?), whose settings it would not follow")
        return handed

    def _inspect(self, handed=()) -> None:
        """What the step uses: found from its closure and globals, and among its arguments (`handed`)."""
        state = self.state
        state.inspected, state.handed = True, list(handed)
        objects = referenced(self.step) + [o for obj in handed for o in referenced(obj)]
        state.optimizers, why = inner_optimizers([o for o in objects if isinstance(o, torch.optim.Optimizer)])
        state.modules = [o for o in objects if isinstance(o, torch.nn.Module)]
        self._survey()
        why = why or why_not_capturable(objects, state.optimizers)
        state.ddps = ddp_modules(state.modules)
        if state.ddps:  # ranks of a DDP step must decide alike: never timed, captured
            state.load = None
        # DDP ranks must decide alike; a compiled function must not meet the recorder
        state.recorded = recording_allowed() and not state.ddps and not compiled(objects)
        if why is not None:
            self._give_up(why)
            return
        make_capturable(state.optimizers, state.made_capturable)

    def _survey(self) -> None:
        """The submodules (`model.bn.eval()` changes a mode of the key) and parameters of the modules."""
        state = self.state
        state.submodules = list(dict.fromkeys(m for top in state.modules for m in top.modules()))
        state.parameters = [p for m in state.modules for p in m.parameters()]

    def _fetch_ahead(self) -> bool:
        """Whether the micro-step batches of this call may be fetched before it: on CUDA, once `warmup`
        calls fetching in pass order have shown that fetching leaves the CUDA generators alone."""
        state = self.state
        if state.fetch_checks is None:
            device = self._param_device()
            state.fetch_checks = 0 if device is not None and device.type == "cuda" else -1
        return state.fetch_checks >= self.warmup and state.disabled is None

    def _fetch_in_order(self, inputs):
        """The step run eagerly, fetching each micro-step's batch when that pass reads it, as the source
        does; on CUDA, watching whether a fetch draws from a CUDA generator (then it stays so for good)."""
        state = self.state
        if state.fetch_checks < 0:
            return self.step(*inputs)  # off CUDA
        if not state.inspected:
            self._inspect()
        fetched = [x for x in inputs if isinstance(x, Fetched)]
        if state.disabled is None:
            state.fetch_checks += 1
            for x in fetched:
                x.watched = True
        result = self._eager([], inputs)
        if state.disabled is None and any(x.moved_device_generator for x in fetched):
            self._give_up(
                "the batches it fetches in each micro-step draw from a CUDA generator; fetched before the step, they would change places with the step's own draws"
            )
        return result

    def _on_cuda(self, tensors) -> bool:
        """CUDA inputs; a step without tensor inputs (it reads buffers of its own) goes by its parameters."""
        if tensors:
            return all(map(_is_cuda, tensors))
        device = self._param_device()
        return device is not None and device.type == "cuda"

    def _param_device(self):
        state = self.state
        objects = state.modules + state.optimizers if state.inspected else referenced(self.step)
        params = [p for o in objects if isinstance(o, torch.nn.Module) for p in o.parameters()]
        params += [p for o in objects if isinstance(o, torch.optim.Optimizer) for g in o.param_groups for p in g["params"]]
        return params[0].device if params and all(p.is_cuda for p in params) else None


def modes_changed(submodules, before: bytes) -> list:
    """The submodules whose train/eval mode differs from `before`, with the mode they have now."""
    return [(m, m.training) for m, was in zip(submodules, before) if m.training != bool(was)]
