"""Staged inputs: a host batch's copy to the GPU queued without the CPU waiting for the replays queued before it.

`x.to(device)` from host memory waits until the GPU has run everything queued before the copy: each
step's copy stalls the CPU until the previous replay is done, so the CPU cannot queue the next replay
while the GPU runs this one. `staged_copy(x, device)` queues the same copy with `non_blocking=True` on the
current stream, after what is queued there as before, and returns at once. Its values cannot change after
the call: from pageable memory the driver copies `x` into a staging buffer of its own before it returns;
from pinned memory (a DataLoader with `pin_memory=True`, or a buffer the loop refills) `x` is first copied
into a pinned block of PyTorch's host allocator, which that allocator does not hand out again before the
copy has run. The result holds the same values as `x.to(device)`; whatever is not a plain host tensor going
to a CUDA device is handed to `.to` (or `.cuda`) as written.

(A copy stream of its own, waited on by an event, would let the GPU run the copy beside the replay; on the
small batches of launch-bound steps its bookkeeping cost more than that won: bench/staging/run.py.)
"""

from __future__ import annotations

import torch


def staged_copy(value, device=None):
    """`value.to(device)` (`value.cuda()` without a device), queued without waiting for the GPU when `value`
    is a host tensor bound for a CUDA device; what `.to` or `.cuda` returns otherwise."""
    target = _cuda_target(value, device)
    if target is None:
        return value.cuda() if device is None else value.to(device)
    if value.is_pinned():
        if not value.is_contiguous():
            return value.to(target)
        held = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        value = held.copy_(value)  # the caller may refill its buffer at once; this block waits for the copy
    return value.to(target, non_blocking=True)


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
    return target
