"""What a CapturedStep keeps for one step function across calls and re-entries of its loop: its graphs,
warmup counts, the optimizers and modules it was found to use, and the record its checks compare with."""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch

from graphify.runtime.common import Timing
from graphify.runtime.reach import layout, layout_change, registrations


class CapturedGraph(NamedTuple):
    """One graph of a step, with what its replays need."""

    graph: torch.cuda.CUDAGraph
    statics: list  # static input tensors, copied into before each replay
    outputs: object  # static outputs, which the next replay overwrites
    gradients: "GraphGradients"
    changed: tuple  # indexes of the inputs the step changes in place: copied back after each replay
    modes_set: list  # (module, training) the step's own mode calls set: set again after each replay


class StepCaptures:
    """Everything captured for one step function: kept across re-entries of its loop."""

    def __init__(self, bindings):
        self.bindings = bindings
        self.layout: tuple = ()  # of the modules and tensors the graphs were captured with (reach.layout)
        self.registrations: tuple = ()  # reach.registrations() when the layout was last found the same
        self.inspected = False
        self.disabled: str | None = None  # why the step runs eagerly for good
        self.side_stream_used = False
        self.optimizers: list = []
        self.made_capturable: list = []  # (optimizer, group) set capturable for the capture: given back if it stays eager
        self.modules: list = []  # top-level modules the step reaches
        self.submodules: list = []  # theirs and every submodule: train/eval modes are part of each graph's key
        self.handed: list = []  # models and optimizers handed to the first call as arguments: the ones inspected
        self.parameters: list = []  # theirs: which require grad is part of each key (freezing, unfreezing)
        self.ddps: list = []  # DistributedDataParallel models the step runs: longer warmup, ranks agree on captures
        self.graphs: dict = {}  # key -> CapturedGraph
        self.eager_runs: dict = {}
        self.pool = None
        self.lr_tensors: list = []  # [param group, device tensor, float it holds]
        self.frozen: list = []  # (param group, name, value at capture) the graph cannot follow
        self.group_counts: list = []  # (optimizer, its param groups at capture): a group added later is not in the graph
        # times the graphs were dropped because a value they froze changed; of those, how many within
        # FEW_REPLAYS replays of the last; the sum of `replays` then
        self.recaptures = self.hasty_recaptures = self.replays_at_forget = 0
        self.load: Timing | None = None  # of the last warmup step
        self.fetch_checks: int | None = None  # eager calls that fetched micro-step batches in order; -1 off CUDA
        self.measured: tuple | None = None  # (GPU ms, host ms) of that step, once the capture decision used it
        self.tried = False  # whether replays were put on trial against eager calls in the loop (common.LoopTrial)
        self.trial = None  # the LoopTrial under way, after the first capture
        self.trial_costs: tuple | None = None  # (eager ms, replay ms) a call, as the trial measured them
        self.recorded = False  # whether warmup calls record the host values the step hands to the GPU
        self.host_values: dict = {}  # key -> the operators' arguments of its last recorded call
        self.recheck: set = set()  # keys checked again at their next check point: the loop was entered again
        self.replays: dict = {}  # key -> replays since its capture
        self.checked: dict = {}  # key -> the replay at which it was last checked (see _rechecked)
        self.entry_checked: dict = {}  # key -> the replay at which it was last checked after a re-entry

    def record_layout(self) -> None:
        """What the graph just captured runs on: the modules' tensors and forwards (reach.layout)."""
        self.layout, self.registrations = layout(self.modules, self.optimizers), registrations()

    def layout_moved(self) -> str | None:
        """What changed in the tensors and forwards the graphs were captured on, in words, or None."""
        self.registrations = registrations()
        now = layout(self.modules, self.optimizers)
        return None if now == self.layout else layout_change(self.layout, now)


_gradient = operator.attrgetter("grad")


class GraphGradients:
    """What one graph does to `.grad`, and what each replay must start from to do what an eager step does.

    A captured backward adds into the gradients the parameters held at capture, at their addresses (`held`),
    and makes a parameter that had none a buffer of its own, which each replay overwrites (`fresh`). Eager
    code between replays moves `.grad`: `zero_grad(set_to_none=True)` unsets it, an eager call of the step
    or the user may leave other tensors there. So before a replay a held gradient takes in what `.grad` holds
    (copied from another tensor, or zeroed where `.grad` is None: eager accumulation then starts from
    nothing, and 0 + g is g); a gradient present where the graph made a fresh one (gradient accumulation
    captured right after a `zero_grad`) would be overwritten instead of added to: the step is captured again
    from it. `left`: what `.grad` is after the step where the step changed it, for eager code after the
    replay (a GradScaler's `unscale_` and `step`) to read.
    """

    def __init__(self, held: list, fresh: list, left: list):
        self.held, self.fresh, self.left = held, fresh, left
        self.watched = [p for p, _, _ in held] + fresh
        self.expected = [t for _, t, _ in held] + [None] * len(fresh)
        self.left_params, self.left_grads = [p for p, _ in left], [g for _, g in left]

    def ready(self) -> bool:
        """Puts `.grad` where the graph reads and leaves it; False (nothing changed) when the gradients
        present do not suit the graph and the step must be captured again. Runs before every replay: one
        pass over the parameters in the usual case."""
        if not all(map(operator.is_, map(_gradient, self.watched), self.expected)) and not self._restore():
            return False
        if not all(map(operator.is_, map(_gradient, self.left_params), self.left_grads)):
            for p, grad in self.left:
                p.grad = grad
        return True

    def _restore(self) -> bool:
        zeroed, sources, targets = [], [], []
        for p, held, reached in self.held:
            grad = p.grad
            if grad is None and not reached:  # changed in place by the step, not by its backward: eager would skip it
                return False
            if grad is None:
                zeroed.append(held)
            elif grad is not held:
                sources.append(grad)
                targets.append(held)
        if any(p.grad is not None for p in self.fresh):
            return False
        if zeroed:
            torch._foreach_zero_(zeroed)
        if targets:
            torch._foreach_copy_(targets, sources)
        for p, held, _ in self.held:
            p.grad = held
        return True


class GradientWatch:
    """The parameters' `.grad` through a capture: what each held before it, and which ones the captured
    backward accumulated into (a hook after each accumulation, removed with `close`)."""

    def __init__(self, params):
        self.params = list(params)
        self.entry = [p.grad for p in self.params]
        self.versions = [None if g is None else g._version for g in self.entry]
        self.reached: set[int] = set()
        self.handles = [p.register_post_accumulate_grad_hook(self._accumulated) for p in self.params if p.requires_grad and p.is_leaf]

    def _accumulated(self, param) -> None:
        self.reached.add(id(param))

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()

    def gradients(self) -> GraphGradients:
        held, fresh, left = [], [], []
        for p, entry, version in zip(self.params, self.entry, self.versions):
            reached = id(p) in self.reached
            if entry is not None and entry._version != version:  # the graph adds to it (or changes it) in place
                held.append((p, entry, reached))
            elif entry is None and reached:
                fresh.append(p)
            if p.grad is not entry:
                left.append((p, p.grad))
        return GraphGradients(held, fresh, left)
