"""What a step function uses, found from the objects themselves: its closure, the globals its code
names and their attributes. The runtime decides from these what the source could not tell."""

from __future__ import annotations

import types

import torch
from torch.utils.hooks import RemovableHandle

from graphify.runtime.distributed import why_ddp_not_capturable

_SAFE_OPTIMIZERS = {  # torch.optim classes whose step can be captured (the Adam family with capturable=True)
    "Adam",
    "AdamW",
    "Adamax",
    "NAdam",
    "RAdam",
    "ASGD",
    "RMSprop",
    "Adadelta",
    "Rprop",
    "SGD",
}
_WRAPPERS = ("DataParallel", "FullyShardedDataParallel")  # DistributedDataParallel: see distributed.py


def referenced(fn, depth: int = 3):
    """Objects a function can reach: its closure, defaults, the globals its code names, and their
    attributes (plain objects and modules, a few levels deep)."""
    seen: set[int] = set()
    found: list = []
    todo = [(fn, 0)]
    while todo:
        obj, level = todo.pop()
        if id(obj) in seen or level > depth or isinstance(obj, (type, types.ModuleType, str, bytes, int, float, bool)):
            continue
        seen.add(id(obj))
        found.append(obj)
        if isinstance(obj, types.MethodType):
            todo += [(obj.__self__, level), (obj.__func__, level)]
        elif isinstance(obj, types.FunctionType):
            todo += [(c.cell_contents, level) for c in obj.__closure__ or () if _filled(c)]
            todo += [(v, level + 1) for v in obj.__defaults__ or ()]
            todo += [(obj.__globals__[n], level + 1) for n in _code_names(obj.__code__) if n in obj.__globals__]
        elif isinstance(obj, (list, tuple)) and len(obj) <= 64:
            todo += [(v, level + 1) for v in obj]
        elif isinstance(obj, dict) and len(obj) <= 64:
            todo += [(v, level + 1) for v in obj.values()]
        elif isinstance(obj, torch.nn.Module):
            todo += [(v, level + 1) for k, v in vars(obj).items() if not k.startswith("_")]
        elif hasattr(obj, "__dict__") and not torch.is_tensor(obj) and not isinstance(obj, torch.optim.Optimizer):
            todo += [(v, level + 1) for v in vars(obj).values()]
    return found


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def bindings(fn) -> tuple:
    """What a step function's free names refer to: the same objects, the same graphs."""
    cells = tuple(c.cell_contents if _filled(c) else None for c in fn.__closure__ or ())
    names = sorted(n for n in _code_names(fn.__code__) if n in fn.__globals__)
    return cells + tuple(fn.__globals__[n] for n in names)


def same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def inner_optimizers(optimizers) -> tuple[list, str | None]:
    """The torch optimizers the step's optimizers step, and why the step cannot be captured (or None).
    Accelerate's wrapper steps its inner optimizer when gradients are synced, through its gradient
    scaler under fp16: captured only without a scaler and without accumulation, where every call steps."""
    found: list = []
    for opt in optimizers:
        if type(opt).__module__.startswith("accelerate") and isinstance(getattr(opt, "optimizer", None), torch.optim.Optimizer):
            if getattr(opt, "scaler", None) is not None:
                return found, "Accelerate steps the optimizer through its gradient scaler (fp16), on the host"
            if getattr(getattr(opt, "gradient_state", None), "num_steps", 1) != 1:
                return found, "Accelerate accumulates gradients: whether the optimizer steps is decided on the host"
            opt = opt.optimizer
        if all(opt is not f for f in found):
            found.append(opt)
    return found, None


def why_not_capturable(objects, optimizers) -> str | None:
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for m in obj.modules():
                if isinstance(m, torch.nn.parallel.DistributedDataParallel):
                    why = why_ddp_not_capturable(m)
                    if why is not None:
                        return why
                elif isinstance(m, torch.nn.DataParallel) and len(m.device_ids) <= 1:
                    continue  # one device: its forward calls the module on inputs already there, nothing to replicate
                elif type(m).__name__ in _WRAPPERS:
                    return f"the step runs a {type(m).__name__} model, whose step is not captured yet"
    for opt in optimizers:
        name = type(opt).__name__
        if not type(opt).__module__.startswith("torch.optim") or name not in _SAFE_OPTIMIZERS:
            return f"the step uses a {name} optimizer, whose step cannot be captured"
    return None


def tensor_addresses(modules, optimizers) -> tuple:
    """Where the parameters, buffers and optimizer state tensors live. A graph reads and writes the
    addresses it was captured with, so a tensor replaced since (an optimizer's `load_state_dict` restoring
    the best epoch, a module's `half()`, a submodule swapped for another) would leave it on the old ones."""
    tensors = [t for m in modules for t in (*m.parameters(), *m.buffers())]
    for optimizer in optimizers:
        tensors += [p for g in optimizer.param_groups for p in g["params"]]
        tensors += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return tuple(t.data_ptr() for t in tensors)


def forward_structure(modules) -> tuple:
    """What the modules' forwards run besides their tensors: each submodule's class (a parametrization
    changes it), a forward set on the instance, its hooks (pruning registers a forward pre-hook at each
    call; each hook has its own key), and the global module hooks."""
    common = tuple(tuple(hooks) for hooks in _global_module_hooks())
    return common + tuple(
        (type(m), m.__dict__.get("forward"), *(tuple(getattr(m, name)) for name in _MODULE_HOOKS)) for top in modules for m in top.modules()
    )


_MODULE_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def _global_module_hooks() -> list:
    return [getattr(torch.nn.modules.module, "_global" + name, {}) for name in _MODULE_HOOKS]


def layout(modules, optimizers) -> tuple:
    """What a graph was captured on: the tensors' addresses and what the forwards run. Compared at the
    checks that tell a graph still holds."""
    return tensor_addresses(modules, optimizers), forward_structure(modules)


def layout_change(before: tuple, after: tuple) -> str:
    """What changed between two layouts, in words."""
    if before[1] != after[1]:
        return "what a module's forward runs changed after the capture (a hook or parametrization added or replaced: pruning, weight norm)"
    return "parameters, buffers or optimizer state tensors were replaced after the capture (a module's half(), a submodule swapped)"


class _Registrations:
    """Parameters, buffers and submodules registered on any module since the first helper was built (by
    global registration hooks, installed once)."""

    count = 0
    watching = False

    @classmethod
    def counted(cls, *_) -> None:  # returns None: the value registered stays as it is
        cls.count += 1


def watch_registrations() -> None:
    if not _Registrations.watching:
        _Registrations.watching = True
        torch.nn.modules.module.register_module_parameter_registration_hook(_Registrations.counted)
        torch.nn.modules.module.register_module_buffer_registration_hook(_Registrations.counted)
        torch.nn.modules.module.register_module_module_registration_hook(_Registrations.counted)


def registrations() -> tuple[int, int]:
    """Two counters, read before each replay at the cost of two attributes: one moves whenever a hook is
    registered anywhere (on a module or a tensor), the other whenever a module registers a parameter, buffer
    or submodule. While neither moves, no module's forward changed its hooks, parametrizations or masks; when
    one does, the layout is compared."""
    return RemovableHandle.next_id, _Registrations.count
