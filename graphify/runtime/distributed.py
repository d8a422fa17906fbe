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
Last, NCCL's communicator, when destroyed, waits until every CUDA graph holding its collectives is
destroyed (pytorch/pytorch#115388): a graph still alive when the process group is shut down hangs the rank
for ever. So every such graph is reset before any process group is shut down or aborted, and at exit,
however the script reaches `destroy_process_group` (see _install_teardown_hooks).
"""

from __future__ import annotations

import atexit
import functools
import gc
import sys
import weakref

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


_teardown_callbacks: list = []  # drop the graphs of DDP steps; the steps run eagerly after
_collective_graphs: weakref.WeakSet = weakref.WeakSet()  # captured graphs holding collectives, while alive


def free_before_teardown(callback) -> None:
    """Have `callback()` (which drops graphs holding collectives) run before any process group is shut
    down, and at exit for a script that never destroys it."""
    _install_teardown_hooks()
    _teardown_callbacks.append(callback)


def holds_collectives(graph) -> None:
    """`graph` recorded collectives: it is reset before any process group is shut down, whoever still
    holds the object. NCCL's communicator waits, when destroyed, until every CUDA graph that captured
    its kernels is destroyed (the graphs keep a reference to it): one graph alive hangs the rank."""
    _install_teardown_hooks()
    _collective_graphs.add(graph)


@functools.cache
def _install_teardown_hooks() -> None:
    """Three ways in, so that none depends on how the script imported anything: the process group's own
    `shutdown` and `abort` (methods of its class, which `destroy_process_group` calls on each group
    however the script reached it), `destroy_process_group` itself (rebound where it was imported by
    name, for versions of torch whose destroy does not call `shutdown`), and an exit hook for a script
    that never destroys its group (registered after torch's own, so it runs before them)."""
    _wrap_process_group_methods()
    _wrap_destroy_process_group()
    atexit.register(free_graphs)


def free_graphs() -> None:
    """Steps holding collectives run eagerly from now on; their graphs are reset once the GPU has run
    every replay queued."""
    callbacks = list(_teardown_callbacks)
    _teardown_callbacks.clear()
    for callback in callbacks:
        callback()
    graphs = list(_collective_graphs)
    if not graphs:
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    for graph in graphs:
        graph.reset()
    _collective_graphs.clear()
    gc.collect()


def _wrap_process_group_methods() -> None:
    try:
        from torch.distributed import distributed_c10d
    except ImportError:  # torch built without distributed support
        return
    group_class = distributed_c10d.ProcessGroup
    for name in ("shutdown", "abort"):
        original = getattr(group_class, name, None)
        if original is None or getattr(original, "_frees_graphs", False):
            continue
        try:
            setattr(group_class, name, _freeing_first(original))
        except (AttributeError, TypeError):  # a class that takes no new attributes: destroy_process_group's wrapper remains
            continue


def _freeing_first(original):
    @functools.wraps(original)
    def method(*args, **kwargs):
        free_graphs()
        return original(*args, **kwargs)

    method._frees_graphs = True
    return method


def _wrap_destroy_process_group() -> None:
    """`destroy_process_group` frees the graphs first; names already bound to it (`from torch.distributed
    import destroy_process_group`) are rebound too."""
    from torch.distributed import distributed_c10d

    original = distributed_c10d.destroy_process_group
    if getattr(original, "_frees_graphs", False):
        return
    destroy_process_group = _freeing_first(original)
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            for name, value in list(namespace.items()):
                if value is original:
                    namespace[name] = destroy_process_group
