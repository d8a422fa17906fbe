"""GraphedModule: a model's forward and backward replayed from CUDA graphs, the rest of the step eager."""

from __future__ import annotations

import gc
import math
import numbers
import warnings
import weakref

import torch

from graphify.runtime.common import (
    WARMUP,
    GraphifyFallbackWarning,
    LoopTrial,
    Timing,
    capture_forced,
    capture_failure,
    collection_paused,
    changed_in_place,
    gpu_bound,
    leaves,
    requires_grad,
    side_stream,
    trial_event,
    tree_map,
    versions,
)
from graphify.runtime.host_values import RECHECK_FROM, HostValues, compiled, drift_reason, first_difference, recording_allowed
from graphify.runtime.reach import layout, layout_change, registrations, watch_registrations, why_not_capturable

_graphed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its graphed callable state
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


class GraphedModule:
    """Runs a module's forward and backward from CUDA graphs (torch.cuda.make_graphed_callables) in a
    training step that cannot be captured whole: the loss, the optimizer and the scheduler stay eager.

    The first `warmup` calls on CUDA with given input shapes and autocast setting run eagerly on a side
    stream; the next one captures the forward and backward for them, as later calls with the same ones
    replay. Other shapes or autocast settings, eval mode, calls without grad and calls off CUDA run
    eagerly; a failed capture leaves the module eager for good, with one warning. So do inputs that
    come in more than MAX_SIGNATURES shapes before one is warmed up (padded per batch), and a graph that
    would gain nothing (unless GRAPHIFY_CAPTURE=always): a GPU-bound forward pass (the last warmup
    call, timed) is not captured, and graphs whose replays are not clearly faster than eager passes
    (timed side by side) are dropped. The warmup passes make_graphed_callables runs itself and the
    timed passes are undone (batch-norm statistics and the CUDA RNG state are restored; their backward
    passes leave `.grad` alone), so training sees each batch once. A replay returns copies of the
    graph's outputs (the eager code around it may keep them past the next replay). Keyword arguments must be plain values
    (a mask ratio, a flag): they are part of the graph's key; a tensor among them runs the call eagerly.

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
        if module not in _graphed:
            _graphed[module] = {
                "warmup_runs": {},  # signature -> eager warmup calls with it, before the capture
                "graphed": None,
                "signature": None,
                "disabled": None,
                "awaiting_backward": False,
                "warmup_awaiting": False,
                "load": None,  # Timing of the last warmup call's forward
                "parameters": list(module.parameters()),  # which require grad is part of the graph's key
                "trained": [],  # those that required grad at capture: the graphed callable's last inputs
                "recorded": None,  # whether warmup calls record the host values the forward hands to the GPU
                "host_values": {},  # signature -> the operators' arguments of its last recorded call
                "replays": 0,  # since the capture
                "checked": 0,  # the replay at which it was last checked (see _rechecked)
                "entry_checked": 0,  # the replay at which it was last checked after being wrapped again
                "recheck": False,  # checked at its next chance: the model was wrapped again (its loop entered again)
                "layout": (),  # of its tensors and submodules at capture (reach.layout)
                "registrations": (),  # reach.registrations() when the layout was last found the same
                "trial": None,  # after the capture: replayed and eager calls in turns in the loop (common.LoopTrial)
                "trial_costs": None,  # (eager ms, replay ms) a call, as the trial measured them
            }
        elif _graphed[module]["recorded"]:
            _graphed[module]["recheck"] = True
        self.state = state = _graphed[module]
        if state["trial"] is not None:  # wrapped again: its loop was entered again, the time since is no call's
            state["trial"].restart()
        watch_registrations()
        if state["graphed"] is not None and state["disabled"] is None and (moved := self._layout_moved()) is not None:
            state["disabled"] = moved
            warnings.warn(f"graphify: the model runs eagerly: {moved}", GraphifyFallbackWarning, stacklevel=2)

    def __call__(self, *inputs, **constants):
        state = self.state
        if state["graphed"] is not None and state["disabled"] is None and registrations() != state["registrations"]:
            if (moved := self._layout_moved()) is not None:  # pruned since the capture, say
                state["disabled"] = moved
                warnings.warn(f"graphify: the model runs eagerly: {moved}", GraphifyFallbackWarning, stacklevel=2)
        if state["disabled"] is not None or not self._graphable(inputs, constants):
            return self.module(*inputs, **constants)
        signature = self._key(inputs, constants)
        if state["graphed"] is None:
            runs = state["warmup_runs"]
            if signature not in runs and len(runs) == MAX_SIGNATURES:
                state["disabled"] = (
                    f"no gain expected: its inputs came in more than {MAX_SIGNATURES} shapes before one of them"
                    " recurred enough to be warmed up, so a graph would rarely replay"
                )
                warnings.warn(f"graphify: the model runs eagerly: {state['disabled']}", GraphifyFallbackWarning, stacklevel=2)
                return self.module(*inputs, **constants)
            if state["recorded"] is None:  # a compiled module must not meet the recorder
                state["recorded"] = recording_allowed() and not compiled([self.module])
            warmup, done = self.warmup + state["recorded"], runs.get(signature, 0)
            # capture updates buffers in place (batch-norm statistics): never while an eager call's
            # backward, which checks the versions of what it saved, is still to come
            if done < warmup or state["warmup_awaiting"]:
                runs[signature] = done + 1
                stream = side_stream(inputs[0].device)
                stream.wait_stream(torch.cuda.current_stream(inputs[0].device))
                with torch.cuda.stream(stream):
                    if state["recorded"] and done in (warmup - 3, warmup - 2):  # the two calls before the timed one
                        outputs = self._compared(signature, inputs, constants, first=done == warmup - 3)
                    else:
                        load = Timing(stream)
                        outputs = self.module(*inputs, **constants)
                        load.stop()
                        state["load"] = load
                torch.cuda.current_stream(inputs[0].device).wait_stream(stream)
                self._await_backward(outputs, "warmup_awaiting")
                return outputs
            if not self._capture(inputs, constants):
                return self.module(*inputs, **constants)
            state["signature"] = signature
        if signature != state["signature"] or state["awaiting_backward"]:
            return self.module(*inputs, **constants)
        if state["trial"] is not None and self._trial_turn() == "eager":
            return self.module(*inputs, **constants)
        n = state["replays"] = state["replays"] + 1
        entered = state["recheck"] and n - state["entry_checked"] >= RECHECK_FROM
        state["recheck"] = False  # only the first replay since the model was wrapped again
        if state["recorded"] and (entered or (n >= RECHECK_FROM and not n & (n - 1))):
            return self._rechecked(signature, inputs, constants, entered)
        self._unshare_gradients()
        outputs = tree_map(torch.Tensor.clone, state["graphed"](*inputs, *state["trained"]))
        self._await_backward(outputs, "awaiting_backward")
        state["registrations"] = registrations()  # its own hook on the outputs changes no forward
        return outputs

    def _trial_turn(self) -> str:
        """Whether this call, which could replay, replays or runs eagerly: eagerly in the trial's eager
        turns, and for good (the graphs dropped, one warning) once replays were found no faster than eager
        calls in this loop: a replay saves the forward's and backward's launches but adds its own work
        (input and output copies, gradient copies, autograd's hooks), which beside eager code that waits
        on the GPU (a NaN guard's read) can cost more than it saves."""
        state = self.state
        trial = state["trial"]
        kind = trial.begin()
        if kind is not None:
            return kind
        state["trial"], state["trial_costs"] = None, trial.costs()
        why = trial.verdict("its forward and backward")
        if why is None:
            return "replay"
        state["disabled"], state["graphed"], state["trained"] = why, None, []
        gc.collect()  # the graphs sit in reference cycles: freed here, not in a DataLoader worker forked later
        warnings.warn(f"graphify: the model runs eagerly: {why}", GraphifyFallbackWarning, stacklevel=3)
        return "eager"

    def _compared(self, signature, inputs, constants, first: bool):
        """A warmup forward that records the host values it hands to the GPU and compares them with the
        last recorded call of this signature: a difference leaves the module eager for good."""
        state = self.state
        with HostValues() as record:
            outputs = self.module(*inputs, **constants)
        before = None if first else state["host_values"].get(signature)
        difference = first_difference(before, record.calls) if before is not None else None
        state["host_values"][signature] = record.calls
        if difference is not None:
            state["disabled"] = drift_reason(difference).replace("the step hands", "the forward hands")
            warnings.warn(f"graphify: the model runs eagerly: {state['disabled']}", GraphifyFallbackWarning, stacklevel=3)
        return outputs

    def _rechecked(self, signature, inputs, constants, entered: bool):
        """A replay run eagerly and recorded instead, against the warmup's record, on CapturedStep's schedule
        (the first replay after the model is wrapped again, if 128 replays have run since the last such
        check, and the 128th, 256th, 512th, ... replay). A host value that moved since the capture (set per epoch by
        code the source does not show) leaves the model eager for good, with a warning that says how many
        replays may have used the old value (none, at a re-entry)."""
        state = self.state
        n, last = state["replays"], state["checked"]
        state["checked"] = n
        if entered:
            state["entry_checked"] = n
        with HostValues() as record:
            outputs = self.module(*inputs, **constants)
        before = state["host_values"].get(signature)
        difference = first_difference(before, record.calls) if before is not None else None
        moved = self._layout_moved()
        if difference is not None or moved is not None:
            stale = f"; up to {n - last - 1} replays before this call may have used the old value" if not entered else ""
            what = f"a host value the forward hands to the GPU moved after the capture ({difference})"
            state["disabled"] = (what if difference else moved) + stale
            warnings.warn(f"graphify: the model runs eagerly: {state['disabled']}", GraphifyFallbackWarning, stacklevel=3)
        return outputs

    def _layout_moved(self) -> str | None:
        """What changed in its tensors and submodules since the capture (reach.layout), or None."""
        state = self.state
        state["registrations"] = registrations()
        now = layout([self.module], [])
        return None if now == state["layout"] else layout_change(state["layout"], now)

    def _key(self, inputs, constants) -> tuple:
        """What a graph is valid for: the call's signature and which parameters require grad (a layer
        frozen or unfrozen between steps changes what the backward computes)."""
        return _signature(inputs, constants), bytes(map(requires_grad, self.state["parameters"]))

    def _await_backward(self, outputs, flag: str) -> None:
        """Sets `flag` until the backward of this call reaches its outputs. After a replay: another
        replay would overwrite the activations that backward needs (a loss summed over two calls, a
        second call of the model in the step), so such calls run eagerly, and a replay whose outputs
        never reach a backward leaves the later calls eager. After a warmup call: capture waits."""
        needing_grad = []
        tree_map(lambda t: (needing_grad.append(t) if t.requires_grad else None) or t, outputs)
        if needing_grad:
            state = self.state
            state[flag] = True
            torch.autograd.graph.register_multi_grad_hook(needing_grad, lambda _: state.update({flag: False}), mode="any")

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
            and (any(t.requires_grad for t in inputs) or any(map(requires_grad, self.state["parameters"])))  # else no backward to graph
            # hooks run at capture only; a hook added after it changes the layout (see __call__)
            and (
                self.state["graphed"] is not None
                or not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in self.module.modules())
            )
        )

    def _capture(self, inputs, constants) -> bool:
        """Graphs the module for these inputs, or leaves it eager for good with one warning."""
        load = self.state["load"]
        why = _wrapped_across_processes(self.module) or why_not_capturable([self.module], [])
        if why is None and load is not None and not capture_forced():
            why = gpu_bound(*load.milliseconds(), "its forward pass")
        why = why or self._graph(inputs, constants)
        if why is None:
            return True
        self.state["disabled"] = why
        warnings.warn(f"graphify: the model runs eagerly: {why}", GraphifyFallbackWarning, stacklevel=4)
        return False

    def _graph(self, inputs, constants) -> str | None:
        """Captures the forward and backward (make_graphed_callables) and, unless capture is forced, times
        them against eager passes; then restores what those extra passes changed. Why the module stays
        eager, or None once its graphs are kept."""
        buffers = [b.clone() for b in self.module.buffers()]
        rng = torch.cuda.get_rng_state()
        # a copy of the generator's state object undoes a failed capture's "capturing" mark; after a
        # capture that worked, the graphs keep the original object, so only its values are restored
        generator = torch.cuda.default_generators[inputs[0].device.index]
        saved_state = generator.clone_state()
        named = [(name, p) for name, p in self.module.named_parameters() if p.requires_grad]
        trained = [p for _, p in named]
        # The graphs are recorded on aliases of the trained parameters (same storage, new leaves) passed as
        # inputs: eager code may keep alive an autograd graph of the model made on another stream (an action
        # picked with grad on), whose gradient accumulators would make a captured backward wait on that
        # stream and fail. A replay is handed the parameters themselves, so their gradients reach `.grad`.
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
        with torch.no_grad():
            for buffer, saved in zip(self.module.buffers(), buffers):
                buffer.copy_(saved)
        if graphed is not None:
            torch.cuda.set_rng_state(rng)
        else:
            generator.graphsafe_set_state(saved_state)
        if why is None:
            self.state["graphed"], self.state["trained"] = graphed, trained
            self.state["layout"], self.state["registrations"] = layout([self.module], []), registrations()
            if not capture_forced():
                self.state["trial"] = LoopTrial(event=trial_event(inputs[0].device))
        else:
            # graphs (or a failed capture's remains) hold static CUDA tensors in reference cycles: collected
            # later, they could be freed in a DataLoader worker forked before, which cannot touch CUDA and aborts
            del graphed, forward, aliases
            gc.collect()
        return why

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
