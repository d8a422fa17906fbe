"""DistributedDataParallel steps: what their capture needs beyond a one-GPU step.

DDP keeps each parameter's gradient accumulator from its construction, and autograd runs an
accumulator on the stream it was made on: built on the default stream, DDP's gradient hooks would run
outside the capture stream. So `graphify rewrite` builds DDP through `build_on_capture_stream`. DDP also
rebuilds its buckets during its first iterations, which must be over before capture (PyTorch's recipe
warms up 11 steps). And whether a collective is captured must be the same on every rank (NCCL's rule):
the ranks agree on each capture before the first replay, and all run eagerly if any rank's failed.
That agreement cannot undo a capture that failed partway through its backward on one rank while the
others recorded their all-reduces: DDP and NCCL may then be out of step, and a later collective can wait
for ever. Such failures are prevented instead: DDP is built on the GPU of its model, not the current one.
Last, a graph holding NCCL collectives keeps its communicator busy, so that destroying the process
group would wait for ever (pytorch/pytorch#115388): the graphs are freed first.
"""

from __future__ import annotations

import atexit
import functools
import gc
import sys

import torch

from graphify.runtime.common import side_stream

DDP_WARMUP = 11
_CAPTURE_STREAM_MARK = "_graphify_built_on_capture_stream"


def _module_device(module) -> torch.device | None:
    """The GPU of the wrapped module's parameters: the current device is not it in a script that never
    calls `torch.cuda.set_device` (each rank passes `device_ids=[local_rank]`), and DDP built on
    another GPU's stream fails its first capture on that rank."""
    param = next(module.parameters(), None) if isinstance(module, torch.nn.Module) else None
    if param is None:
        return torch.device("cuda", torch.cuda.current_device())
    return param.device if param.is_cuda else None


def build_on_capture_stream(build, *args, **kwargs):
    """`build(*args, **kwargs)` (a DistributedDataParallel wrapper) run on the stream steps are captured on."""
    if not torch.cuda.is_available():
        return build(*args, **kwargs)
    device = _module_device(args[0] if args else kwargs.get("module"))
    if device is None:
        return build(*args, **kwargs)  # a CPU model (gloo): nothing is captured
    stream = side_stream(device)
    with torch.cuda.device(device):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            module = build(*args, **kwargs)
        torch.cuda.current_stream().wait_stream(stream)
    setattr(module, _CAPTURE_STREAM_MARK, True)
    return module


def ddp_modules(modules) -> list:
    seen, found = set(), []
    for module in modules:
        for m in module.modules():
            if isinstance(m, torch.nn.parallel.DistributedDataParallel) and id(m) not in seen:
                seen.add(id(m))
                found.append(m)
    return found


def why_ddp_not_capturable(ddp) -> str | None:
    import torch.distributed as dist

    if not getattr(ddp, _CAPTURE_STREAM_MARK, False):
        return "the step runs a DistributedDataParallel model built outside graphify's capture stream (rewrite the file that builds it)"
    if ddp.find_unused_parameters:
        return "its DistributedDataParallel model has find_unused_parameters=True, which walks the autograd graph on the host every step"
    if not dist.is_initialized() or dist.get_backend(ddp.process_group) != "nccl":
        return "its DistributedDataParallel model does not communicate through NCCL, whose collectives are the ones a graph can hold"
    return None


def all_ranks_agree(ok: bool, ddps: list, device) -> bool:
    """Whether the capture succeeded on every rank of each DDP model's process group (one small all-reduce)."""
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    for ddp in ddps:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=ddp.process_group)
    return bool(flag.item())


_teardown_callbacks: list = []  # free the graphs of DDP steps


def free_before_teardown(callback) -> None:
    """Have `callback()` (which drops graphs holding collectives) run before any process group is
    destroyed, and at exit for a script that never destroys it."""
    _install_teardown_hooks()
    _teardown_callbacks.append(callback)


@functools.cache
def _install_teardown_hooks() -> None:
    _wrap_destroy_process_group()
    atexit.register(_free_graphs)


def _free_graphs() -> None:
    for callback in _teardown_callbacks:
        callback()
    _teardown_callbacks.clear()
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _wrap_destroy_process_group() -> None:
    """`destroy_process_group` frees the graphs first; names already bound to it (`from torch.distributed
    import destroy_process_group`) are rebound too."""
    from torch.distributed import distributed_c10d

    original = distributed_c10d.destroy_process_group
    if getattr(original, "_frees_graphs", False):
        return

    @functools.wraps(original)
    def destroy_process_group(*args, **kwargs):
        _free_graphs()
        return original(*args, **kwargs)

    destroy_process_group._frees_graphs = True
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            for name, value in list(namespace.items()):
                if value is original:
                    namespace[name] = destroy_process_group
