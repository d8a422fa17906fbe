"""GraphedModule: a model's forward and backward replayed from CUDA graphs, the rest of the step eager,
through the phases of states.py; ModuleState, what it keeps for a model across calls and wrappings."""

from __future__ import annotations

import math
import numbers
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from graphify.runtime.common import (
    WARMUP,
    LoopTrial,
    Timing,
    capture_failure,
    capture_forced,
    changed_in_place,
    collection_paused,
    free_dropped_graphs,
    leaves,
    requires_grad,
    side_stream,
    trial_event,
    tree_map,
    versions,
)
from graphify.runtime.host_values import HostValues, compiled, drift_reason, first_difference, recording_allowed
from graphify.runtime.reach import registrations, watch_registrations, why_not_capturable
from graphify.runtime.states import GraphStates, Phase, Wrapper, registry

# A replay pays for its checks, autograd.Function, input copies, output clones and gradient copies, and
# saves only the forward and backward launches: on a small model that can cost more than it saves (two
# small fixtures' partial rewrites ran 0.54x and 0.94x as fast as eager). Graphs are kept when a replayed
# forward and backward is at least this much faster than an eager one, timed side by side after capture.
MIN_REPLAY_GAIN = 1.1
TIMED_PASSES = 3  # of each kind, after an untimed one of each; the fastest counts
# Warmup is counted per signature, so the graph is recorded for a shape that recurs (not one seen once, such
# as an epoch's short last batch). Inputs padded to each batch's longest sequence rarely recur: past this
# many shapes before one has been warmed up, the model stays eager.
MAX_SIGNATURES = 8


class ModuleGraph(NamedTuple):
    """A model's forward and backward graphs for one signature."""

    graphed: object  # what torch.cuda.make_graphed_callables made: called with the inputs and `trained`
    trained: list  # the parameters that required grad at capture


@dataclass(eq=False)
class ModuleState(GraphStates):
    """Everything a GraphedModule keeps for one model: its signatures (states.KeyState), of which one at most
    is CAPTURED, and whether a backward is still to come. Read as a mapping too (`state["graphed"]`)."""

    module: object = None  # a weak reference to the model: the registry's value must not keep its key alive
    parameters: list = field(default_factory=list)  # which require grad is part of the graph's key
    signature: tuple | None = None  # the key CAPTURED
    awaiting_backward: bool = False  # the last replay's backward is still to come: calls run eagerly
    warmup_awaiting: bool = False  # the last warmup call's backward is still to come: capture waits
    inputs_warned: bool = False  # a call on CUDA ran eagerly for inputs a graph cannot take, with one warning
    graph_bytes: int = 0  # device memory the CAPTURED signature's graphs hold

    @property
    def graphed(self):
        """The graphed callable of the signature CAPTURED, or None."""
        return None if self.signature is None else self.keys[self.signature].graph.graphed

    @property
    def warmup_runs(self) -> dict:
        return {key: entry.eager_runs for key, entry in self.keys.items() if entry.eager_runs}

    def __getitem__(self, name: str):
        return getattr(self, name)

    def captured_on(self) -> tuple[list, list]:
        return [self.module()], []

    def stop(self, why: str) -> None:
        captured = self.signature is not None
        super().stop(why)
        self.signature = None
        if captured:
            free_dropped_graphs(self.graph_bytes)


class GraphedModule(Wrapper):
    """Runs a module's forward and backward from CUDA graphs (torch.cuda.make_graphed_callables) in a
    training step that cannot be captured whole: the loss, the optimizer and the scheduler stay eager.

    Each signature (input shapes, autocast setting, keyword values, which parameters require grad) goes
    through the phases of states.py: the first `warmup` calls on CUDA run eagerly on a side stream (two
    of them, one call more, RECORD the host values the forward hands to the GPU), and the next one
    captures the forward and backward (CAPTURE), as later calls with the same signature replay
    (CAPTURED). One signature is captured: others, eval mode, calls without grad and calls off CUDA run
    eagerly. A failed capture leaves the module eager for good (EAGER), with one warning. So do inputs
    that come in more than MAX_SIGNATURES shapes before one is warmed up (padded per batch), and a graph
    that would gain nothing (unless GRAPHIFY_CAPTURE=always): a GPU-bound forward pass (the last warmup
    call, timed) is not captured, graphs whose replays are not clearly faster than eager passes (timed
    side by side) are dropped, and so are replays no faster than eager calls in the loop (the loop
    trial: a replay saves the forward's and backward's launches but adds its own work, which beside eager
    code that waits on the GPU, a NaN guard's read, can cost more than it saves). The warmup passes
    make_graphed_callables runs itself and the timed passes are undone (batch-norm statistics and the
    CUDA RNG state are restored; their backward passes leave `.grad` alone), so training sees each batch
    once. A replay returns copies of the graph's outputs (the eager code around it may keep them past the
    next replay). Keyword arguments must be plain values (a mask ratio, a flag): they are part of the
    graph's key; a tensor among them runs the call eagerly.

    A replayed backward hands autograd the graph's own gradient buffers, and a parameter without a
    gradient takes that buffer as its `.grad`: the next replay would overwrite it. So gradients still
    present when a replay starts (accumulation over micro-batches, `zero_grad(set_to_none=False)`)
    are first copied out of the buffers, in one fused copy, and accumulate as they would eagerly.

    A call made while the last replay still waits for its backward runs eagerly: the model may be called
    more than once per step, or under a condition, and stay exact.
    """

    def __init__(self, module, warmup: int = WARMUP):
        self.module = module
        self.warmup = warmup
        watch_registrations()
        self.state, new = registry.module_state(
            module, lambda: ModuleState(module=weakref.ref(module), parameters=list(module.parameters()))
        )
        if not new:
            self.state.entered_again()  # wrapped again: its loop was entered again
        if (moved := self.state.guard(always=True)) is not None:
            self._give_up(moved)

    def __getattr__(self, name: str):
        """A helper handed the graphed model in place of the model reads it as the model: its modes, its
        parameters and attributes (`model.train()`, `model.parameters()`) are the module's."""
        module = self.__dict__.get("module")
        if module is None:
            raise AttributeError(name)
        return getattr(module, name)

    def __call__(self, *inputs, **constants):
        state = self.state
        if (moved := state.guard()) is not None:  # pruned since the capture, say
            self._give_up(moved)
        if state.disabled is not None or not self._graphable(inputs, constants):
            if state.disabled is None and not state.inputs_warned:
                self._warn_inputs(inputs, constants)
            return self.module(*inputs, **constants)
        signature = self._key(inputs, constants)
        if state.signature is None:
            if state.recorded is None:  # a compiled module must not meet the recorder
                state.recorded = recording_allowed() and not compiled([self.module])
            phase = state.phase(signature, self.warmup + state.recorded)
            # capture updates buffers in place (batch-norm statistics): never while an eager call's
            # backward, which checks the versions of what it saved, is still to come
            if phase is not Phase.CAPTURE or state.warmup_awaiting:
                return self._warm(phase, signature, inputs, constants)
            outcome = self._capture(signature, inputs, constants)
            if outcome == "time":  # GPU-bound so far: one more timed warmup call tells
                return self._warm(phase, signature, inputs, constants)
            if outcome == "eager":
                return self.module(*inputs, **constants)
        if signature != state.signature or state.awaiting_backward:
            return self.module(*inputs, **constants)
        return self._replayed(signature, inputs, constants)

    def _warm(self, phase, signature, inputs, constants):
        """A warmup call: eager on the side stream; a RECORD call compares host values; until the capture
        decision, all but a signature's first are timed (they tell a GPU-bound forward: common.WarmupLoad)."""
        state = self.state
        runs = state.warm(signature, MAX_SIGNATURES)
        if runs is None:
            self._give_up(
                f"no gain expected: its inputs came in more than {MAX_SIGNATURES} shapes before one of them"
                " recurred enough to be warmed up, so a graph would rarely replay"
            )
            return self.module(*inputs, **constants)
        stream = side_stream(inputs[0].device)
        stream.wait_stream(torch.cuda.current_stream(inputs[0].device))
        with torch.cuda.stream(stream):
            timing = Timing(stream) if self._timed(runs) else None
            if phase is Phase.RECORD:
                outputs = self._compared(signature, inputs, constants, first=runs == self.warmup + state.recorded - 3)
            else:
                outputs = self.module(*inputs, **constants)
            if timing is not None:
                timing.stop()
                state.load.add(timing, recorded=phase is Phase.RECORD)
        torch.cuda.current_stream(inputs[0].device).wait_stream(stream)
        self._await_backward(outputs, "warmup_awaiting")
        return outputs

    def _replayed(self, signature, inputs, constants):
        """A CAPTURED call: a replay, or an eager call in the loop trial's eager turns, or a replay run
        recorded and checked (_rechecked)."""
        state = self.state
        entry = state.keys[signature]
        if state.trial is not None and self._trial_turn("its forward and backward") == "eager":
            return self.module(*inputs, **constants)
        checked, entered = entry.count_replay(state.recorded)
        if checked:
            return self._rechecked(signature, inputs, constants, entered)
        self._unshare_gradients()
        outputs = tree_map(torch.Tensor.clone, entry.graph.graphed(*inputs, *entry.graph.trained))
        self._await_backward(outputs, "awaiting_backward")
        state.registrations = registrations()  # its own hook on the outputs changes no forward
        return outputs

    def _compared(self, signature, inputs, constants, first: bool):
        """A RECORD call: records the host values the forward hands to the GPU and compares them with the
        last recorded call of this signature: a difference leaves the module eager for good."""
        entry = self.state.keys[signature]
        with entry.recording(), HostValues() as record:
            outputs = self.module(*inputs, **constants)
        before = None if first else entry.host_values
        difference = first_difference(before, record.calls) if before is not None else None
        entry.host_values = record.calls
        if difference is not None:
            self._give_up(drift_reason(difference).replace("the step hands", "the forward hands"))
        return outputs

    def _rechecked(self, signature, inputs, constants, entered: bool):
        """A replay run eagerly and recorded instead, against the warmup's record, on CapturedStep's schedule
        (states.KeyState.count_replay). A host value that moved since the capture (set per epoch by code the
        source does not show) leaves the model eager for good, with a warning that says how many replays may
        have used the old value (none, at a re-entry)."""
        entry = self.state.keys[signature]
        stale = entry.start_check(entered)
        with entry.recording(), HostValues() as record:
            outputs = self.module(*inputs, **constants)
        difference = first_difference(entry.host_values, record.calls) if entry.host_values is not None else None
        moved = self.state.layout_moved()
        if difference is not None or moved is not None:
            what = f"a host value the forward hands to the GPU moved after the capture ({difference})" if difference else moved
            self._give_up(what + (f"; up to {stale} replays before this call may have used the old value" if not entered else ""))
        return outputs

    def _key(self, inputs, constants) -> tuple:
        """What a graph is valid for: the call's signature and which parameters require grad (a layer
        frozen or unfrozen between steps changes what the backward computes)."""
        return _signature(inputs, constants), bytes(map(requires_grad, self.state.parameters))

    def _await_backward(self, outputs, flag: str) -> None:
        """Sets `flag` until the backward of this call reaches its outputs. After a replay: another
        replay would overwrite the activations that backward needs (a loss summed over two calls, a
        second call of the model in the step), so such calls run eagerly, and a replay whose outputs
        never reach a backward leaves the later calls eager. After a warmup call: capture waits."""
        needing_grad = []
        tree_map(lambda t: (needing_grad.append(t) if t.requires_grad else None) or t, outputs)
        if needing_grad:
            state = self.state
            setattr(state, flag, True)
            torch.autograd.graph.register_multi_grad_hook(needing_grad, lambda _: setattr(state, flag, False), mode="any")

    def _unshare_gradients(self) -> None:
        """Gradients present before a replay may be the graph's buffers (taken by autograd on the last
        replayed backward): copy them out before the next backward overwrites the buffers."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        if params:
            copies = torch._foreach_mul([p.grad for p in params], 1.0)  # exact: x * 1.0 == x, one fused kernel
            for p, copy in zip(params, copies):
                p.grad = copy

    def _graphable(self, inputs, constants) -> bool:
        return (
            self.module.training
            and torch.is_grad_enabled()
            and bool(inputs)
            and all(torch.is_tensor(t) and t.is_cuda for t in inputs)
            and all(v is None or isinstance(v, (numbers.Number, str)) for v in constants.values())
            and (any(t.requires_grad for t in inputs) or any(map(requires_grad, self.state.parameters)))  # else no backward to graph
            # hooks run at capture only; a hook added after it changes the layout (see __call__)
            and (
                self.state.signature is not None
                or not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in self.module.modules())
            )
        )

    def _warn_inputs(self, inputs, constants) -> None:
        """One warning, the first time a training call on CUDA runs eagerly for its inputs' sake: a positional
        input that is not a tensor, a keyword value that is not a plain one (a graph's inputs are tensors;
        plain keyword values are part of its key). Calls with inputs it can take are still graphed."""
        if not (self.module.training and torch.is_grad_enabled()):
            return
        if not any(t.is_cuda for t in leaves([inputs, list(constants.values())])):
            return
        why = untakeable(inputs, constants)
        if why is not None:
            self.state.inputs_warned = True
            self._warn(
                f"{why}, which a graph cannot take (its inputs are tensors, passed by position; plain values passed by keyword are part of its key): calls like it run eagerly"
            )

    def _capture(self, signature, inputs, constants) -> str:
        """The CAPTURE call: graphs the module for these inputs ("captured"), or leaves it eager for good
        with one warning ("eager"), or, before the first capture, finds too few timed warmup calls to tell
        whether its forward is GPU-bound ("time": this call is one more)."""
        why = _wrapped_across_processes(self.module) or why_not_capturable([self.module], [])
        if why is None:
            verdict = self._load_verdict("its forward pass")
            if verdict != "capture":
                return verdict
            why = self._graph(signature, inputs, constants)
        if why is None:
            return "captured"
        self._give_up(why)
        return "eager"

    def _graph(self, signature, inputs, constants) -> str | None:
        """Captures the forward and backward and, unless capture is forced, times them against eager passes
        (_make_graphed); then restores what those extra passes changed. Why the module stays eager, or None
        once its graphs are kept: the signature is CAPTURED."""
        buffers = [b.clone() for b in self.module.buffers()]
        rng = torch.cuda.get_rng_state()
        # a copy of the generator's state object undoes a failed capture's "capturing" mark; after a
        # capture that worked, the graphs keep the original object, so only its values are restored
        generator = torch.cuda.default_generators[inputs[0].device.index]
        saved_state = generator.clone_state()
        allocated = torch.cuda.memory_allocated(inputs[0].device)
        graphed, trained, why = self._make_graphed(inputs, constants)
        held = max(torch.cuda.memory_allocated(inputs[0].device) - allocated, 0)  # the graphs' pool, their static tensors
        with torch.no_grad():
            for buffer, saved in zip(self.module.buffers(), buffers):
                buffer.copy_(saved)
        if graphed is not None:
            torch.cuda.set_rng_state(rng)
        else:
            generator.graphsafe_set_state(saved_state)
        if why is not None:
            del graphed  # with a failed capture's remains, in reference cycles: see free_dropped_graphs
            free_dropped_graphs(held)
            return why
        state = self.state
        state.graph_bytes = held
        state.entry(signature).graph, state.signature = ModuleGraph(graphed, trained), signature
        state.record_layout()
        if not capture_forced():
            state.trial = LoopTrial(event=trial_event(inputs[0].device))
        return None

    def _make_graphed(self, inputs, constants) -> tuple:
        """(the graphed callable, or None if capture failed; the parameters it is handed; why it is not kept,
        or None). The graphs are recorded on aliases of the trained parameters (same storage, new leaves)
        passed as inputs: eager code may keep alive an autograd graph of the model made on another stream
        (an action picked with grad on), whose gradient accumulators would make a captured backward wait on
        that stream and fail. A replay is handed the parameters themselves, so their gradients reach `.grad`."""
        named = [(name, p) for name, p in self.module.named_parameters() if p.requires_grad]
        trained = [p for _, p in named]
        aliases = [p.detach().requires_grad_() for p in trained]
        names = [name for name, _ in named]

        def forward(*args):
            parameters = dict(zip(names, args[len(inputs) :]))
            return torch.func.functional_call(self.module, parameters, args[: len(inputs)], constants)

        samples = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs) + tuple(aliases)
        before = versions(samples[: len(inputs)])
        cache = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)  # cached casts would outlive the capture; the values are the same
        graphed, why = None, None
        try:
            with torch.cuda.device(inputs[0].device), collection_paused():  # make_graphed_callables: on the current GPU's streams
                graphed = torch.cuda.make_graphed_callables(forward, samples)
                if changed_in_place(samples[: len(inputs)], before):
                    why = "its forward changes an input in place, which a replay would do to a copy of the input"
                elif not capture_forced():
                    why = slower_replays(*self._time_passes(graphed, inputs, constants, trained))
        except Exception as exc:  # noqa: BLE001 - a failed capture leaves the module eager
            why = capture_failure(exc)
        finally:
            torch.set_autocast_cache_enabled(cache)
        return graphed, trained, why

    def _time_passes(self, graphed, inputs, constants, trained) -> tuple[float, float]:
        """(eager ms, replay ms): the fastest of TIMED_PASSES forward and backward passes of each kind on
        copies of the call's inputs, each started on an idle GPU and measured as the longer of its host
        and GPU times. A replayed pass runs what a replay in __call__ runs, its checks included. The
        backward passes run through torch.autograd.grad: no `.grad` changes."""
        copies = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)
        wrt = [p for p in self.module.parameters() if p.requires_grad] + [t for t in copies if t.requires_grad]
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]

        def replayed():
            self._graphable(copies, constants) and self._key(copies, constants)  # __call__'s checks
            if grads:
                torch._foreach_mul(grads, 1.0)  # _unshare_gradients' copy, not assigned
            outputs = tree_map(torch.Tensor.clone, graphed(*copies, *trained))
            needing = [t for t in leaves(outputs) if t.requires_grad]
            if needing:
                torch.autograd.graph.register_multi_grad_hook(needing, lambda _: None, mode="any")
            return needing

        def eager():
            return [t for t in leaves(self.module(*copies, **constants)) if t.requires_grad]

        fastest = {eager: math.inf, replayed: math.inf}
        for timed in [False] + [True] * TIMED_PASSES:
            for forward in fastest:
                torch.cuda.synchronize()
                timing = Timing(torch.cuda.current_stream())
                needing = forward()
                if needing and wrt:
                    torch.autograd.grad(needing, wrt, [torch.ones_like(t) for t in needing], allow_unused=True)
                timing.stop()
                if timed:
                    fastest[forward] = min(fastest[forward], max(timing.milliseconds()))
        return fastest[eager], fastest[replayed]


def _wrapped_across_processes(module) -> str | None:
    """Why a model that synchronises gradients across processes is not graphed alone: DDP and FSDP
    reduce gradients from hooks that fire during the backward, outside what make_graphed_callables sees."""
    for m in module.modules():
        name = type(m).__name__
        if isinstance(m, torch.nn.parallel.DistributedDataParallel) or name == "FullyShardedDataParallel" or name.startswith("FSDP"):
            return f"its {name} wrapper reduces gradients from hooks in the backward, which a graph of the model alone would skip"
    return None


def untakeable(inputs, constants) -> str | None:
    """What in a call's arguments a graph cannot take, in words, or None: a positional input that is not a
    tensor, a keyword value that is neither None, a number nor a string."""
    for i, value in enumerate(inputs):
        if not torch.is_tensor(value):
            return f"its positional input {i + 1} is {_kind(value)}"
    for name, value in constants.items():
        if not (value is None or isinstance(value, (numbers.Number, str))):
            return f"its keyword argument `{name}` is {_kind(value)}"
    return None


def _kind(value) -> str:
    return "a tensor" if torch.is_tensor(value) else "None" if value is None else f"a `{type(value).__name__}`"


def slower_replays(eager_ms: float, replay_ms: float) -> str | None:
    """Why graphs that replay the forward and backward in `replay_ms` are dropped for eager passes that
    take `eager_ms`; None when the replays are at least MIN_REPLAY_GAIN times faster."""
    if eager_ms >= MIN_REPLAY_GAIN * replay_ms:
        return None
    return (
        f"no gain expected: a replayed forward and backward took {replay_ms:.2f} ms, an eager one {eager_ms:.2f} ms "
        f"(graphs are kept from {MIN_REPLAY_GAIN:.1f}x faster; GRAPHIFY_CAPTURE=always captures it anyway)"
    )


def _signature(inputs, constants) -> tuple:
    """What a graph is valid for: its inputs' shapes, dtypes, devices and grad flags, the autocast
    setting and the keyword values."""
    return (*[(t.shape, t.dtype, t.device, t.requires_grad) for t in inputs], _autocast_setting(), tuple(sorted(constants.items())))


def _autocast_setting():
    """The CUDA autocast state a graph was recorded under: its casts are part of the graph."""
    enabled = torch.is_autocast_enabled("cuda")
    return enabled, torch.get_autocast_dtype("cuda") if enabled else None
