"""Teacher forcing for `graphify verify`: the rewrite runs on the original's trajectory.

The original saves its training state after each step (parameters, gradients, buffers of the modules
that own them, optimizer state, RNG states of torch, CUDA, numpy and `random`). Hyperparameters such as
the learning rate are not loaded: the rewrite's own scheduler must keep them on the original's course.
The rewrite loads the original's state after step k in place (static buffers and graph addresses stay
valid) before it runs step k+1, and measures how far its own state after step k+1 is from the
original's: each step is compared from identical state, so one step's rounding never compounds.

Loaded by path from graphify/verify/child.py: imports only torch and the standard library.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import warnings

BUDGET_BYTES = 2 << 30  # states saved every step up to this much, then every STRIDE steps
STRIDE = 10


class Forcing:
    def __init__(self, torch, mode: str, folder: str) -> None:
        self.torch, self.mode, self.folder = torch, mode, folder  # mode: "record" | "force"
        self.modules = None
        self.saved_bytes = 0
        self.metrics: dict[int, dict] = {}  # step -> differences from the original after that step
        self.forced: list[int] = []  # steps that started from the original's state
        os.makedirs(folder, exist_ok=True)

    def after_step(self, k: int, optimizers, carried=()) -> None:
        """At the probe after step k (1-based). `carried`: tensors the next step reads again (hidden
        state), saved and loaded like the parameters but not compared (the losses show them)."""
        if self.modules is None:
            self.modules = _owning_modules(self.torch, optimizers)
        if self.mode == "record":
            if self.saved_bytes < BUDGET_BYTES or k % STRIDE in (0, STRIDE - 1):
                state = snapshot(self.torch, optimizers, self.modules, carried)
                self.saved_bytes += sum(t.numel() * t.element_size() for t in _tensors(state))
                self.torch.save(state, self._path(k))
            return
        here, before = self._load(k), self._load(k - 1)
        if here is not None and before is not None and k in self.forced:
            current = snapshot(self.torch, optimizers, self.modules)
            self.metrics[k] = differences(self.torch, current, here, before)
        if here is not None:
            restore(self.torch, optimizers, self.modules, here, carried)
            self.forced.append(k + 1)

    def _path(self, k: int) -> str:
        return os.path.join(self.folder, f"state{k}.pt")

    def _load(self, k: int):
        path = self._path(k)
        if k < 1 or not os.path.exists(path):
            return None
        return self.torch.load(path, map_location="cpu", weights_only=False)


def _owning_modules(torch, optimizers) -> list:
    """Modules that own the optimizers' parameters (for their buffers), in a stable order: by the index
    of their first parameter among the optimizers' parameters."""
    index = {id(p): i for i, p in enumerate(_params(optimizers))}
    found = {}
    with warnings.catch_warnings():  # isinstance on every live object wakes deprecated lazy attributes
        warnings.simplefilter("ignore")
        modules = [obj for obj in gc.get_objects() if _is_module(torch, obj)]
    for obj in modules:
        if any(True for _ in obj.buffers(recurse=False)):
            owned = [index[id(p)] for p in obj.parameters() if id(p) in index]
            if owned:
                found.setdefault(min(owned), obj)
    return [found[i] for i in sorted(found)]


def _is_module(torch, obj) -> bool:
    try:
        return isinstance(obj, torch.nn.Module)
    except ReferenceError:  # a weakref.proxy whose object is gone (torch.compile leaves some): no module
        return False


def _params(optimizers) -> list:
    return [p for opt in optimizers for group in opt.param_groups for p in group["params"]]


def snapshot(torch, optimizers, modules, carried=()) -> dict:
    cpu = lambda t: t.detach().to("cpu", copy=True)  # noqa: E731
    params = _params(optimizers)
    state = {
        "params": [cpu(p) for p in params],
        "grads": [None if p.grad is None else cpu(p.grad) for p in params],
        "optim": [
            {k: cpu(v) if torch.is_tensor(v) else v for k, v in opt.state.get(p, {}).items()}
            for opt in optimizers
            for group in opt.param_groups
            for p in group["params"]
        ],
        "buffers": [{name: cpu(b) for name, b in m.named_buffers(recurse=False) if b is not None} for m in modules],
        "rng": {"torch": torch.get_rng_state(), "random": random.getstate()},
        "carried": [cpu(t) for t in _leaves(carried)],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["rng"]["cuda"] = torch.cuda.get_rng_state_all()
    if "numpy" in sys.modules:
        state["rng"]["numpy"] = sys.modules["numpy"].random.get_state()
    return state


def restore(torch, optimizers, modules, state, carried=()) -> None:
    """Load a snapshot in place: the tensors the rewrite's graphs read keep their addresses."""
    params = _params(optimizers)
    with torch.no_grad():
        for live, saved in zip(_leaves(carried), state.get("carried", [])):
            if live.shape == saved.shape:
                live.copy_(saved)
        for p, saved, grad in zip(params, state["params"], state["grads"]):
            p.copy_(saved)
            if grad is not None:
                if p.grad is None:
                    p.grad = grad.to(p.device)
                else:
                    p.grad.copy_(grad)
        slots = [(opt, p) for opt in optimizers for group in opt.param_groups for p in group["params"]]
        for (opt, p), saved in zip(slots, state["optim"]):
            live = opt.state[p]
            for key, value in saved.items():
                if torch.is_tensor(value) and torch.is_tensor(live.get(key)) and live[key].shape == value.shape:
                    live[key].copy_(value)
                else:
                    live[key] = value.to(p.device) if torch.is_tensor(value) else value
        for module, buffers in zip(modules, state["buffers"]):
            live = dict(module.named_buffers(recurse=False))
            for name, value in buffers.items():
                if name in live and live[name] is not None:
                    live[name].copy_(value)
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["random"])
    if "cuda" in rng:
        torch.cuda.set_rng_state_all(rng["cuda"])
    if "numpy" in rng and "numpy" in sys.modules:
        sys.modules["numpy"].random.set_state(rng["numpy"])


def differences(torch, current, original, before) -> dict:
    """How far the rewrite's state after a step is from the original's, relative to how far the
    original's step moved it: ||rewrite - original|| / ||original - original before the step||, for
    parameters, optimizer state and buffers together (each part's global norm), and the worst tensor."""
    out = {}
    for part in ("params", "optim", "buffers"):
        a, b, prev = (_flat(torch, s[part]) for s in (current, original, before))
        names = sorted(set(a) & set(b))
        if not names:
            continue
        # a state of another shape than the original's is as far from it as can be; a state the step before
        # had in another shape (the loop entered again with another model) gives that tensor no scale
        delta = sum(
            float(torch.linalg.vector_norm((a[n].double() - b[n].double()).nan_to_num(nan=float("inf"))) ** 2)
            if a[n].shape == b[n].shape
            else float("inf")
            for n in names
        )
        moved = sum(
            float(torch.linalg.vector_norm(b[n].double() - prev[n].double()) ** 2)
            for n in names
            if n in prev and prev[n].shape == b[n].shape
        )
        size = sum(float(torch.linalg.vector_norm(b[n].double()) ** 2) for n in names)
        eps = torch.finfo(b[names[0]].dtype).eps if b[names[0]].is_floating_point() else 0.0
        out[part] = delta**0.5 / max(moved**0.5, eps * size**0.5, 1e-30)
        out[part + "_abs"] = delta**0.5
    return out


def _flat(torch, part) -> dict:
    """Floating-point tensors of a snapshot part, by a stable name."""
    out = {}
    for i, item in enumerate(part):
        if isinstance(item, dict):
            for key, value in item.items():
                if torch.is_tensor(value) and value.is_floating_point() and key != "step":
                    out[f"{i}.{key}"] = value
        elif torch.is_tensor(item) and item.is_floating_point():
            out[str(i)] = item
    return out


def _tensors(state):
    for value in state.values():
        if isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    yield from (v for v in item.values() if hasattr(v, "numel"))
                elif hasattr(item, "numel"):
                    yield item


def _leaves(value):
    """The tensors in a value of nested tuples, lists and dicts (an LSTM's (h, c))."""
    if hasattr(value, "numel"):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
