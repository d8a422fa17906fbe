"""GraphedModule: a model's forward and backward replayed from CUDA graphs, the rest of the step eager."""

from __future__ import annotations

import functools
import numbers
import warnings
import weakref

import torch

from graphify.runtime.common import WARMUP, GraphifyFallbackWarning, first_line, side_stream, tree_map
from graphify.runtime.reach import why_not_capturable

_graphed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its graphed callable state


class GraphedModule:
    """Runs a module's forward and backward from CUDA graphs (torch.cuda.make_graphed_callables) in a
    training step that cannot be captured whole: the loss, the optimizer and the scheduler stay eager.

    The first `warmup` calls on CUDA run eagerly on a side stream; the next one captures the forward
    and backward for that call's input shapes and autocast setting, as later calls with the same ones
    replay. Other shapes or autocast settings, eval mode, calls without grad and calls off CUDA run
    eagerly; a failed capture leaves the module eager for good, with one warning. The warmup passes
    make_graphed_callables runs itself are undone (batch-norm statistics and the CUDA RNG state are
    restored), so training sees each batch once. A replay returns copies of the graph's outputs (the
    eager code around it may keep them past the next replay). Keyword arguments must be plain values
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
                "eager_runs": 0,
                "graphed": None,
                "signature": None,
                "disabled": None,
                "awaiting_backward": False,
                "warmup_awaiting": False,
            }
        self.state = _graphed[module]

    def __call__(self, *inputs, **constants):
        state = self.state
        if state["disabled"] is not None or not self._graphable(inputs, constants):
            return self.module(*inputs, **constants)
        signature = [(t.shape, t.dtype, t.device, t.requires_grad) for t in inputs] + [_autocast_setting(), sorted(constants.items())]
        if state["graphed"] is None:
            # capture updates buffers in place (batch-norm statistics): never while an eager call's
            # backward, which checks the versions of what it saved, is still to come
            if state["eager_runs"] < self.warmup or state["warmup_awaiting"]:
                state["eager_runs"] += 1
                stream = side_stream(inputs[0].device)
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    outputs = self.module(*inputs, **constants)
                torch.cuda.current_stream().wait_stream(stream)
                self._await_backward(outputs, "warmup_awaiting")
                return outputs
            if not self._capture(inputs, constants):
                return self.module(*inputs, **constants)
            state["signature"] = signature
        if signature != state["signature"] or state["awaiting_backward"]:
            return self.module(*inputs, **constants)
        self._unshare_gradients()
        outputs = tree_map(torch.Tensor.clone, state["graphed"](*inputs))
        self._await_backward(outputs, "awaiting_backward")
        return outputs

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
            and not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in self.module.modules())
        )

    def _capture(self, inputs, constants) -> bool:
        buffers = [b.clone() for b in self.module.buffers()]
        rng = torch.cuda.get_rng_state()
        # a copy of the generator's state object undoes a failed capture's "capturing" mark; after a
        # capture that worked, the graphs keep the original object, so only its values are restored
        generator = torch.cuda.default_generators[inputs[0].device.index]
        saved_state = generator.clone_state()
        why = why_not_capturable([self.module], [])
        if why is None:
            # make_graphed_callables swaps the forward of the module it is given: give it a holder
            holder = torch.nn.Module()
            holder.module = self.module
            holder.forward = functools.partial(self.module.__call__, **constants)
            samples = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)
            cache = torch.is_autocast_cache_enabled()
            torch.set_autocast_cache_enabled(False)  # cached casts would outlive the capture; the values are the same
            try:
                self.state["graphed"] = torch.cuda.make_graphed_callables(holder, samples)
            except Exception as exc:  # noqa: BLE001 - a failed capture leaves the module eager
                why = f"capture failed ({type(exc).__name__}: {first_line(exc)})"
            finally:
                torch.set_autocast_cache_enabled(cache)
        with torch.no_grad():
            for buffer, saved in zip(self.module.buffers(), buffers):
                buffer.copy_(saved)
        if why is None:
            torch.cuda.set_rng_state(rng)
            return True
        generator.graphsafe_set_state(saved_state)
        self.state["disabled"] = why
        warnings.warn(f"graphify: the model runs eagerly: {why}", GraphifyFallbackWarning, stacklevel=4)
        return False


def _autocast_setting():
    """The CUDA autocast state a graph was recorded under: its casts are part of the graph."""
    enabled = torch.is_autocast_enabled("cuda")
    return enabled, torch.get_autocast_dtype("cuda") if enabled else None
