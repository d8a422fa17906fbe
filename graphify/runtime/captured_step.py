"""CapturedStep: a whole training or inference step, warmed up, captured and replayed."""

from __future__ import annotations

import functools
import sys
import warnings

import torch

from graphify.runtime.captures import CapturedGraph, GradientWatch, StepCaptures
from graphify.runtime.common import (
    WARMUP,
    Fetched,
    GraphifyFallbackWarning,
    Identity,
    LoopTrial,
    Timing,
    capture_forced,
    copy_outputs,
    capture_failure,
    collection_paused,
    changed_in_place,
    fits,
    gpu_bound,
    leaves,
    requires_grad,
    restore_host_state,
    save_host_state,
    side_stream,
    split,
    trial_event,
    tree_map,
    versions,
)
from graphify.runtime.distributed import DDP_WARMUP, all_ranks_agree, ddp_modules, free_before_teardown, holds_collectives
from graphify.runtime.host_values import RECHECK_FROM, HostValues, compiled, drift_reason, first_difference, recording_allowed
from graphify.runtime.optimizer_settings import give_back, make_capturable, moved_settings, use_tensor_lrs
from graphify.runtime.reach import bindings, inner_optimizers, referenced, registrations, same, watch_registrations, why_not_capturable

MAX_KEYS = 16  # graphs (and warmups) per step: beyond, a host value changes every step and the step stays eager
FEW_REPLAYS = 32  # a graph dropped after fewer replays did not pay for its capture


_registry: dict = {}  # step code object -> StepCaptures of its latest bindings, newest last
KEPT_PER_STEP = 4  # e.g. one train() function called in turn for a few models


class CapturedStep:
    """Runs one training (or inference) step from a CUDA graph.

    For each key (host branch outcomes such as "the optimizer steps this time", the modes of the modules
    and their submodules, whether grad is enabled) the first `warmup` calls on CUDA run eagerly on a side
    stream, two of them recording the host values handed to the operators (one more call: they must
    agree, or the step stays eager); the next call copies its inputs into static buffers, captures the
    step and replays it; later calls copy their inputs in and replay. Inputs of another shape, dtype or
    device and calls off CUDA run eagerly; a call after a setting the graph froze has changed (a float
    learning rate on an optimizer that cannot read a tensor one, betas, momentum or eps moved, a param
    group added) captures again at once; a replay run recorded (see _rechecked) that shows a host value
    moved, or a module changed since the capture (pruned: reach.layout), makes the step warm up and capture again.
    Before a replay, `.grad` is put where the graph adds into it and leaves it (captures.GraphGradients). A replay
    returns the graph's static outputs, which the next replay overwrites: `copy_outputs` keeps them.
    """

    def __init__(self, step, device=None, warmup: int = WARMUP):
        self.step = step
        self.device = torch.device(device) if device is not None else None
        self.warmup = warmup
        watch_registrations()
        bound = bindings(step)
        states = _registry.setdefault(step.__code__, [])
        state = next((s for s in states if same(s.bindings, bound)), None)
        if state is None:
            state = StepCaptures(bound)
            states.append(state)
            del states[:-KEPT_PER_STEP]
        elif state.recorded:  # its loop entered again (the next epoch): each graph is checked at its next chance
            state.recheck = set(state.graphs)
        if state.trial is not None:  # the time since its last call is not a call's
            state.trial.restart()
        self.state = state
        if state.graphs and state.layout_moved() is not None:
            self._forget_graphs()  # e.g. the optimizer's state loaded from the best epoch's checkpoint

    copy = staticmethod(copy_outputs)
    fetch = staticmethod(Fetched)  # `train_step.fetch(lambda: next(loader), k)`: the batches of k micro-steps

    def __call__(self, *inputs, key=()):
        state = self.state
        if any(isinstance(x, Fetched) for x in inputs):
            if not self._fetch_ahead():
                return self._fetch_in_order(inputs)
            inputs = tuple(x.fetch_all() if isinstance(x, Fetched) else x for x in inputs)
        if self.device is not None and self.device.type == "cuda":
            inputs = tree_map(lambda t: t.to(self.device, non_blocking=True), inputs)
        tensors, host = split(inputs)
        if not self._on_cuda(tensors):
            return self.step(*inputs)
        handed = [h.obj for h in host if isinstance(h, Identity) and isinstance(h.obj, (torch.nn.Module, torch.optim.Optimizer))]
        if not state.inspected:
            self._inspect(handed)
        elif state.disabled is None and any(isinstance(o, torch.optim.Optimizer) and all(o is not k for k in state.handed) for o in handed):
            self._give_up("it is handed an optimizer other than its first call's (a new one per fold?), whose settings it would not follow")
        if state.disabled is not None:
            return self._eager(tensors, inputs) if state.side_stream_used else self.step(*inputs)
        if state.graphs and registrations() != state.registrations and state.layout_moved() is not None:
            self._forget_graphs()  # pruned since the capture, say: a new mask buffer and forward pre-hook
            return self.__call__(*inputs, key=key)
        modes = bytes(m.training for m in state.submodules), bytes(map(requires_grad, state.parameters))
        if handed:  # a model handed in (one of an ensemble): its identity is in the key, its modes too
            modes += (bytes(m.training for h in handed if isinstance(h, torch.nn.Module) for m in h.modules()),)
        key = (key, host, torch.is_grad_enabled(), modes)
        captured = state.graphs.get(key)
        if captured is not None:
            static_tensors, grads = captured.statics, captured.gradients
            if (moved := moved_settings(state.group_counts, state.frozen)) is not None:  # SGD's LR moved by a per-epoch scheduler
                self._forget_graphs(warm=moved == "lr" and not state.ddps)
                return self.__call__(*inputs, key=key[0])
            if fits(static_tensors, tensors):
                if self._trial_turn() == "eager":
                    return self._eager(tensors, inputs)
                if not grads.ready():  # a gradient present where the graph makes its own: capture adding to it
                    self._forget_graphs(warm=not state.ddps)
                    return self.__call__(*inputs, key=key[0])
                n = state.replays[key] = state.replays.get(key, 0) + 1
                entered = False
                if key in state.recheck:  # its first replay since the loop was entered again
                    state.recheck.discard(key)
                    entered = n - state.entry_checked.get(key, 0) >= RECHECK_FROM
                if state.recorded and (entered or (n >= RECHECK_FROM and not n & (n - 1))):
                    return self._rechecked(key, tensors, inputs, entered)
                return self._replay(captured, tensors)
            return self._eager(tensors, inputs)
        runs = state.eager_runs.get(key, 0)
        if runs == 0 and len(state.eager_runs) >= MAX_KEYS:
            self._give_up(f"its host inputs or branch keys took more than {MAX_KEYS} values (a Python value that changes every step?)")
            return self._eager(tensors, inputs)
        warmup = max(self.warmup, DDP_WARMUP) if state.ddps else self.warmup + state.recorded
        if runs < warmup:
            state.eager_runs[key] = runs + 1
            timed = runs == warmup - 1 and state.load is None and not state.ddps  # ranks of a DDP step must decide alike
            if state.recorded and runs in (warmup - 3, warmup - 2):  # the two calls before the timed one
                return self._compared(key, tensors, inputs, first=runs == warmup - 3)
            return self._eager(tensors, inputs, timed=timed)
        if self._gpu_bound():
            return self._eager(tensors, inputs)
        return self._capture(key, tensors, inputs)

    def _replay(self, captured, tensors):
        """Copy the inputs in, follow a moved learning rate, replay; then what eager code would see changed."""
        graph, static_tensors, static_outputs, _, changed, modes_set = captured
        for static, new in zip(static_tensors, tensors):
            static.copy_(new, non_blocking=True)
        for entry in self.state.lr_tensors:
            group, lr, value = entry
            if group["lr"] != value:  # the scheduler moved it: one small fill, outside the graph
                lr.fill_(group["lr"])
                entry[2] = group["lr"]
        graph.replay()
        for i in changed:  # inputs the step changes in place: the caller's tensors change, as in eager
            tensors[i].copy_(static_tensors[i], non_blocking=True)
        for module, training in modes_set:  # `model.train()` in the step: replays set the flag, as eager would
            module.training = training
        return static_outputs

    def _trial_turn(self) -> str:
        """Whether this call, which could replay, replays or runs eagerly: eagerly in the eager turns of the
        loop trial after the first capture (common.LoopTrial), and for good once the trial found replays
        no faster than eager calls in this loop."""
        state = self.state
        trial = state.trial
        if trial is None:
            return "replay"
        kind = trial.begin()
        if kind is not None:
            return kind
        state.trial, state.trial_costs = None, trial.costs()
        why = trial.verdict("a step")
        if why is None:
            return "replay"
        self._give_up(why)
        return "eager"

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

    # ---- first calls ----------------------------------------------------------------------------

    def _inspect(self, handed=()) -> None:
        """What the step uses: found from its closure and globals, and among its arguments (`handed`)."""
        state = self.state
        state.inspected, state.handed = True, list(handed)
        objects = referenced(self.step) + [o for obj in handed for o in referenced(obj)]
        state.optimizers, state.disabled = inner_optimizers([o for o in objects if isinstance(o, torch.optim.Optimizer)])
        state.modules = [o for o in objects if isinstance(o, torch.nn.Module)]
        self._survey()
        state.disabled = state.disabled or why_not_capturable(objects, state.optimizers)
        state.ddps = ddp_modules(state.modules)
        # DDP ranks must decide alike; a compiled function must not meet the recorder
        state.recorded = recording_allowed() and not state.ddps and not compiled(objects)
        if state.disabled is not None:
            self._warn(state.disabled)
            return
        make_capturable(state.optimizers, state.made_capturable)

    def _eager(self, tensors, inputs, timed: bool = False):
        """An eager step on the side stream (as warmup must be, and so that autograd keeps one stream);
        `timed`: its host and GPU time are kept, to tell a GPU-bound step before capturing it."""
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
                    self.state.load = timing
                return result
        finally:
            torch.set_autocast_cache_enabled(cache)
            torch.cuda.current_stream(device).wait_stream(stream)

    def _compared(self, key, tensors, inputs, first: bool):
        """A warmup call that records the host values the step hands to the GPU, and compares them with
        the last recorded call of this key: any difference leaves the step eager for good, since a graph
        would replay the values it was captured with. (Only warmup calls: an eager call between replays
        would leave `.grad` pointing away from the graph's gradient buffers, which eager code after a
        replay, a GradScaler's step, reads.)"""
        state = self.state
        counted = registrations()
        with HostValues(state.optimizers) as record:
            result = self._eager(tensors, inputs)
        now = registrations()
        if state.registrations == counted == (now[0] - len(record.handles), now[1]):
            state.registrations = now  # the recorder's own optimizer hooks change no forward
        calls = [tuple((t.shape, t.dtype) for t in tensors), *record.calls]  # only calls on inputs of one shape compare
        before = None if first else state.host_values.get(key)
        difference = first_difference(before, calls) if before is not None and before[0] == calls[0] else None
        state.host_values[key] = calls
        if difference is not None:
            self._give_up(drift_reason(difference))
        return result

    def _rechecked(self, key, tensors, inputs, entered: bool):
        """A replay run eagerly and recorded instead, against its warmup's record: the first replay after
        the loop is entered again (the next epoch) if 128 replays have run since the last such check (a
        recorded call costs many replays), and the 128th, 256th, 512th, ... replay. A host value that moved
        since warmup (a per-epoch value set by code the source does not show) makes the step capture again
        with it; with one warning unless found on entering the loop (replays before may have used the old)."""
        state = self.state
        n, last = state.replays[key], state.checked.get(key, 0)
        state.checked[key] = n
        if entered:
            state.entry_checked[key] = n
        with HostValues(state.optimizers) as record:
            result = self._eager(tensors, inputs)
        before = state.host_values.get(key)
        difference = first_difference(before[1:], record.calls) if before is not None else None
        moved = state.layout_moved()
        if difference is not None or moved is not None:
            if not entered:
                why = f"a host value the step hands to the GPU moved after the capture ({difference})" if difference else moved
                self._warn(f"{why}; up to {n - last - 1} replays before this call may have used the old value", "captured again")
            self._forget_graphs()
        return result

    def _gpu_bound(self) -> bool:
        """Whether the last warmup step kept the GPU busy far longer than the host took to launch it (decided
        once, before the first capture): then a replay gains nothing and the step stays eager."""
        state = self.state
        if state.load is None or state.measured is not None or capture_forced():
            return False
        state.measured = state.load.milliseconds()
        why = gpu_bound(*state.measured, "a step")
        if why is not None:
            self._give_up(why)
        return why is not None

    def _capture(self, key, tensors, inputs):
        state = self.state
        device = tensors[0].device if tensors else self._param_device()
        static_inputs = tree_map(torch.Tensor.clone, inputs)
        statics = leaves(static_inputs)
        before = versions(statics)
        trained = dict.fromkeys([*state.parameters, *(p for o in state.optimizers for g in o.param_groups for p in g["params"])])
        saved = save_host_state(trained, device)
        watch = GradientWatch(trained)
        swapped = use_tensor_lrs(state.optimizers, state.lr_tensors, state.frozen, state.group_counts)
        graph = torch.cuda.CUDAGraph()
        cache = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)
        try:
            with (
                collection_paused(),
                torch.cuda.graph(graph, pool=state.pool, stream=side_stream(device), capture_error_mode="thread_local"),
            ):
                static_outputs = self.step(*static_inputs)
        except Exception as exc:  # noqa: BLE001 - any failure of capture leaves the run eagerly, never stopped
            failure = capture_failure(exc)
        else:
            failure = None
        finally:
            torch.set_autocast_cache_enabled(cache)
            watch.close()
            for group, lr in swapped:  # the graph reads the tensors; the groups show floats again
                group["lr"] = lr
        if state.ddps:  # every rank takes part, whatever its own outcome
            agreed = all_ranks_agree(failure is None, state.ddps, device)
            if failure is None and not agreed:
                failure = "the capture failed on another rank (captured collectives must match on every rank)"
        if failure is not None:
            restore_host_state(saved)
            self._give_up(failure)
            return self._eager(tensors, inputs)
        state.pool = graph.pool()
        changed = changed_in_place(statics, before)  # a forward that normalises its input in place, say
        state.record_layout()
        modes_set = modes_changed(state.submodules, key[3][0])  # by the step's own mode calls, which replays skip
        state.graphs[key] = CapturedGraph(graph, statics, static_outputs, watch.gradients(), changed, modes_set)
        if state.ddps:
            holds_collectives(graph)
            if len(state.graphs) == 1:
                free_before_teardown(functools.partial(_drop_graphs, state, "its process group was destroyed"))
        elif not state.tried and not capture_forced():  # DDP ranks would have to agree on each turn: not tried
            state.tried, state.trial = True, LoopTrial(event=trial_event(device))
        graph.replay()  # capture records the step without running it: this replay trains on the batch
        for i in changed:
            tensors[i].copy_(statics[i], non_blocking=True)
        return static_outputs

    def _forget_graphs(self, warm: bool = False) -> None:
        """A value the graphs froze has changed: capture again, at the next call after a learning rate
        (`warm`: the step's warmup and host-value record still hold), after a new warmup otherwise. Values
        that change within FEW_REPLAYS replays of a capture, more than MAX_KEYS times, leave it eager."""
        state = self.state
        state.recaptures += 1
        replayed = sum(state.replays.values())
        state.hasty_recaptures += replayed - state.replays_at_forget < FEW_REPLAYS
        state.graphs, state.pool = {}, None
        if state.trial is not None:  # warmup and capture come before the next replayed call
            state.trial.restart()
        state.lr_tensors, state.frozen, state.group_counts = [], [], []
        if not warm:
            self._survey()  # a module may have changed (pruning, a parametrization)
            state.eager_runs, state.replays, state.checked, state.entry_checked, replayed = {}, {}, {}, {}, 0
        state.replays_at_forget = replayed
        # a param group added since (progressive unfreezing) comes with the optimizer's defaults
        make_capturable(state.optimizers, state.made_capturable)
        if state.hasty_recaptures > MAX_KEYS:
            self._give_up(
                f"a value the graph reads as a constant (a learning rate, momentum, a host value) changed within {FEW_REPLAYS} replays of its capture more than {MAX_KEYS} times"
            )

    # ---- helpers ------------------------------------------------------------------------------

    def _survey(self) -> None:
        """The submodules (`model.bn.eval()` changes a mode of the key) and parameters of the modules."""
        state = self.state
        state.submodules = list(dict.fromkeys(m for top in state.modules for m in top.modules()))
        state.parameters = [p for m in state.modules for p in m.parameters()]

    def _on_cuda(self, tensors) -> bool:
        """CUDA inputs; a step without tensor inputs (it reads buffers of its own) goes by its parameters."""
        if tensors:
            return all(t.is_cuda for t in tensors)
        device = self._param_device()
        return device is not None and device.type == "cuda"

    def _param_device(self):
        state = self.state
        objects = state.modules + state.optimizers if state.inspected else referenced(self.step)
        params = [p for o in objects if isinstance(o, torch.nn.Module) for p in o.parameters()]
        params += [p for o in objects if isinstance(o, torch.optim.Optimizer) for g in o.param_groups for p in g["params"]]
        return params[0].device if params and all(p.is_cuda for p in params) else None

    def _give_up(self, why: str) -> None:
        """Eager for good, with one warning: the graphs dropped, and the optimizers given back the settings
        they were built with (capturable arithmetic run eagerly is slower), unless another step still
        captures with them."""
        state = self.state
        _drop_graphs(state, why)
        state.lr_tensors, state.frozen = [], []
        in_use = [o for states in _registry.values() for s in states if s.disabled is None for o in s.optimizers]
        give_back(state.made_capturable, in_use)
        self._warn(why)

    def _warn(self, why: str, outcome: str = "runs eagerly") -> None:
        """One warning, shown at the line of the loop that called the step."""
        level, frame = 1, sys._getframe(0)
        while frame is not None and frame.f_locals.get("self") is self:  # this step's own frames
            level, frame = level + 1, frame.f_back
        name = getattr(self.step, "__qualname__", "step")
        warnings.warn(f"graphify: `{name}` {outcome}: {why}", GraphifyFallbackWarning, stacklevel=level)


def modes_changed(submodules, before: bytes) -> list:
    """The submodules whose train/eval mode differs from `before`, with the mode they have now."""
    return [(m, m.training) for m, was in zip(submodules, before) if m.training != bool(was)]


def _drop_graphs(state: StepCaptures, why: str) -> None:
    state.graphs, state.pool, state.disabled = {}, None, why
