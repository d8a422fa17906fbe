"""What a captured step's backward does to `.grad`: GradientWatch classifies the parameters' gradients
through a capture, and GraphGradients puts `.grad` where each replay reads and leaves it."""

from __future__ import annotations

import operator

import torch

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
        if self.watched and not all(map(operator.is_, map(_gradient, self.watched), self.expected)) and not self._restore():
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
