"""What both helpers share: the side stream, the fallback warning, nested inputs and outputs."""

from __future__ import annotations

import dataclasses
import numbers

import torch

WARMUP = 3  # eager calls per graph before capture (3 as torch.cuda.make_graphed_callables)


class GraphifyFallbackWarning(RuntimeWarning):
    """A step that runs eagerly instead of from a CUDA graph; the message says why."""


_side_streams: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device, shared by every helper: autograd ties each parameter's gradient
    accumulator to the stream of its first backward, so a second stream would break a later capture."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _side_streams:
        _side_streams[index] = torch.cuda.Stream(device=index)
    return _side_streams[index]


# ---- nested inputs and outputs -------------------------------------------------------------------


def leaves(value) -> list:
    """The tensors of a value made of tuples, lists, dicts, mappings and dataclasses, in order."""
    out: list = []
    _leaves(value, out, [])
    return out


def split(value) -> tuple[list, tuple]:
    """The tensors of a value, and everything else in it (numbers, flags, strings; other objects by
    identity): a capture is valid only for the host values it was captured with."""
    tensors: list = []
    host: list = []
    _leaves(value, tensors, host)
    return tensors, tuple(host)


def _leaves(value, out, host) -> None:
    if torch.is_tensor(value):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _leaves(v, out, host)
    elif isinstance(value, dict):
        for k, v in value.items():
            host.append(k)
            _leaves(v, out, host)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _leaves(getattr(value, f.name), out, host)
    elif value is None or isinstance(value, (numbers.Number, str, bytes)):  # NumPy scalars too: by value
        host.append(value)
    else:
        host.append(id(value))


def tree_map(fn, value):
    """`value` with every tensor replaced by fn(tensor), keeping each container's type."""
    if torch.is_tensor(value):
        return fn(value)
    if isinstance(value, tuple):
        items = [tree_map(fn, v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, list):
        return type(value)(tree_map(fn, v) for v in value)
    if isinstance(value, dict):
        items = {k: tree_map(fn, v) for k, v in value.items()}
        if dataclasses.is_dataclass(value):  # mapping-like model outputs are dataclasses too
            return dataclasses.replace(value, **{k: v for k, v in items.items() if k in _init_fields(value)})
        try:
            return type(value)(items)
        except TypeError:
            return items
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{name: tree_map(fn, getattr(value, name)) for name in _init_fields(value)})
    return value


def _init_fields(value) -> set[str]:
    return {f.name for f in dataclasses.fields(value) if f.init}


def copy_outputs(value):
    """A copy of a replay's outputs that the next replay does not overwrite."""
    return tree_map(torch.Tensor.clone, value)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"
