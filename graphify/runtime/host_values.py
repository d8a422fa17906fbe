"""The host values a step hands to the GPU work it launches, recorded while it runs eagerly.

A graph replays its kernels with the Python numbers they were launched with at capture: a loss weight
read from an object the loop changes, a dropout probability set by a callback, a module's attribute read
through a property. The source does not always show such a read, so the runtime looks at what reaches
the operators: each warmup call records the non-tensor arguments of every operator the step runs (and
the values of small host tensors handed to them), and two calls that should be the same graph must
agree. Optimizer steps are left out: the runtime follows the optimizers' settings itself (tensor
learning rates, a new capture when a setting it froze moves).
"""

from __future__ import annotations

import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

RECHECK_FROM = 128  # replays between two checks of a graph on entering its loop; the first periodic check
SMALL_HOST_TENSOR = 16  # elements: a host tensor this small handed to an operator is a value, recorded


def recording_allowed() -> bool:
    """GRAPHIFY_HOST_CHECK=off: no recording (the planted-bug suite proves verify catches what it would)."""
    return os.environ.get("GRAPHIFY_HOST_CHECK") != "off"


def compiled(objects) -> bool:
    """Whether the step reaches a torch.compile'd module or function: compiled code meeting the recorder
    would run uncompiled, or compile again."""
    modules = [m for o in objects if isinstance(o, torch.nn.Module) for m in o.modules()]
    return any(type(m).__name__ == "OptimizedModule" for m in modules) or any(hasattr(o, "_torchdynamo_orig_callable") for o in objects)


def _small_host(arg) -> bool:
    return (
        isinstance(arg, torch.Tensor)
        and arg.device.type == "cpu"
        and arg.layout == torch.strided
        and not arg.is_quantized
        and arg.numel() <= SMALL_HOST_TENSOR
    )


def _value(arg, device_made=frozenset()):
    if isinstance(arg, torch.Tensor):
        if _small_host(arg):
            if arg.numel() and arg.untyped_storage().data_ptr() in device_made:
                return None  # made by the step's own device work (see _Recorder)
            return ("host tensor", tuple(_value(x) for x in arg.detach().flatten().tolist()))
        return None  # a device tensor's contents belong to the graph (or to a static input buffer)
    if isinstance(arg, float):
        return arg.hex()  # NaN equals itself, -0.0 differs from 0.0
    if isinstance(arg, (list, tuple)):
        return tuple(_value(x, device_made) for x in arg)
    if arg is None or isinstance(arg, (bool, int, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return arg
    return type(arg).__name__  # a generator or another object: by kind only


class _Recorder(TorchDispatchMode):
    """A small host tensor that an operator on device tensors returned is not a host value: its contents
    come from the GPU's work, such as the random seed and offset that attention with dropout hands its
    backward (under capture they live on the device and advance with the graph's generator). Such
    tensors are kept until the call ends, so that their storage is not reused by one that is."""

    def __init__(self):
        super().__init__()
        self.calls: list = []
        self.paused = 0
        self.made_by_device: list = []
        self.device_made: set = set()  # their storages' addresses

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.paused:
            try:
                arguments = _value(args, self.device_made)
                keywords = _value(tuple(sorted(kwargs.items())), self.device_made)
            except Exception:  # noqa: BLE001 - an argument the recorder cannot read never stops the step
                arguments, keywords = ("unreadable",), ()
            # operators on tensors alone are left out: they carry no host value, and autograd's gradient
            # accumulation takes a tensor as it is on the first pass (`detach`) and adds to it later (`add_`)
            if _holds_value(arguments) or keywords:
                self.calls.append((str(func), arguments, keywords))
        result = func(*args, **kwargs)
        if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in (*args, *kwargs.values())):
            for out in result if isinstance(result, (list, tuple)) else (result,):
                if _small_host(out) and out.numel():
                    self.made_by_device.append(out)
                    self.device_made.add(out.untyped_storage().data_ptr())
        return result


def _holds_value(recorded) -> bool:
    if isinstance(recorded, tuple):
        return any(_holds_value(x) for x in recorded)
    return recorded is not None


class HostValues:
    """`with HostValues(optimizers) as record: step()`, then `record.calls`: what each operator got."""

    def __init__(self, optimizers=()):
        self.optimizers = list(optimizers)
        self.recorder = _Recorder()
        self.handles: list = []
        self.calls: list = []

    def __enter__(self):
        for optimizer in self.optimizers:
            if isinstance(optimizer, torch.optim.Optimizer):
                self.handles.append(optimizer.register_step_pre_hook(lambda *_: self._pause(1)))
                self.handles.append(optimizer.register_step_post_hook(lambda *_: self._pause(-1)))
        self.recorder.__enter__()
        return self

    def __exit__(self, *exc):
        self.recorder.__exit__(*exc)
        for handle in self.handles:
            handle.remove()
        self.calls = self.recorder.calls
        self.recorder.made_by_device.clear()
        return False

    def _pause(self, by: int) -> None:
        self.recorder.paused += by


def first_difference(before: list, after: list) -> str | None:
    """Where two recordings of the same step part, in words; None when they agree."""
    for index, (a, b) in enumerate(zip(before, after)):
        if a != b:
            if a[0] != b[0]:
                return f"operator {index} was `{a[0]}`, then `{b[0]}`"
            return f"`{a[0]}` got {_shown(a[1:])}, then {_shown(b[1:])}"
    if len(before) != len(after):
        return f"it ran {len(before)} operators, then {len(after)}"
    return None


def _shown(arguments) -> str:
    text = repr(arguments)
    return text if len(text) <= 120 else text[:117] + "..."


def drift_reason(difference: str) -> str:
    return (
        f"a host value the step hands to the GPU changed between steps ({difference}); a graph would keep the "
        "value it was captured with (pass it in as an argument, or keep it on the device)"
    )
