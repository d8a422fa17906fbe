"""Staged inputs: a host batch's copy to the GPU issued on a copy stream, so that the CPU does not wait for
the replays queued before it.

`x.to(device)` from host memory waits until the GPU has run everything queued before the copy: each
step's copy stalls the CPU until the previous replay is done, and the CPU cannot queue the next replay
while the GPU runs this one. `staged_copy(x, device)` makes the same copy on a stream of its own, which
waits for nothing queued before it; the current stream waits for the copy (an event, no host wait), and
the CPU waits only for the copy itself to have read `x`, so that code writing into `x` afterwards (a
reused pinned buffer) cannot change what was copied. The result holds the same values as `x.to(device)`;
whatever is not a plain host tensor going to a CUDA device is handed to `.to` (or `.cuda`) as written.
"""

from __future__ import annotations

import torch

_COPY_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def staged_copy(value, device=None):
    """`value.to(device)` (`value.cuda()` without a device), its copy on a copy stream when `value` is a
    host tensor bound for a CUDA device; what `.to` or `.cuda` returns otherwise."""
    target = _cuda_target(value, device)
    if target is None:
        return value.cuda() if device is None else value.to(device)
    current = torch.cuda.current_stream(target)
    stream = _copy_stream(target)
    with torch.cuda.stream(stream):
        staged = value.to(target, non_blocking=True)  # allocated from the copy stream's pool
    copied = stream.record_event()
    current.wait_event(copied)
    staged.record_stream(current)  # its memory is not reused before the current stream is done with it
    copied.synchronize()  # the copy has read `value`: the caller may write into it again
    return staged


def _cuda_target(value, device) -> torch.device | None:
    """The CUDA device a plain host tensor is copied to, or None: not a copy this module stages (a
    module, a batch object with its own `.to`, a dtype, a tensor on the GPU already, a tensor autograd
    tracks, inside a capture)."""
    if type(value) is not torch.Tensor or value.device.type != "cpu" or value.requires_grad or value.layout is not torch.strided:
        return None
    if not isinstance(device, (torch.device, str, int)) and device is not None:
        return None
    try:
        target = torch.device("cuda") if device is None else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        return None
    if target.type != "cuda" or not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
        return None
    return torch.device("cuda", torch.cuda.current_device()) if target.index is None else target


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    stream = _COPY_STREAMS.get(device)
    if stream is None:
        stream = _COPY_STREAMS[device] = torch.cuda.Stream(device)
    return stream
