"""What both helpers share: the side stream, the fallback warning, timings that tell when a graph
gains nothing, nested inputs and outputs."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import math
import numbers
import operator
import os
import random
import statistics
import time

import torch

WARMUP = 3  # eager calls per graph before capture (3 as torch.cuda.make_graphed_callables)
# Work whose host time is under this share of its GPU time is GPU-bound: the GPU, not the launches, sets
# the pace, so a replay (which saves only host time) would save nothing and add input copies; it stays
# eager (GRAPHIFY_CAPTURE=always captures it all the same). Launch-bound work measures about 1 (the GPU
# waits on each launch); H200: a bf16 CNN at 37 ms a step measured 0.26, a small transformer 1.0.
GPU_BOUND_SHARE = 0.5
# Before the first capture, warmup calls are timed (WarmupLoad): every one but a key's first (lazy loading,
# cuDNN's autotuning). Work stays eager, uncaptured, when this many of them were GPU-bound and none of the
# calls run without the host-value recorder was not (the recorder slows the host: a recorded call that is
# not GPU-bound says nothing, one that is says so all the more). Wanting more, the capture waits for more
# timed eager calls, up to LOAD_CALLS in all; then what was measured decides, capture when in doubt.
GPU_BOUND_CALLS = 3
LOAD_CALLS = 8
# After a capture, replayed and eager calls run in turns in the user's loop (LoopTrial): the graphs are kept
# only when a replayed call of the loop is at least MIN_LOOP_GAIN times faster than an eager one. A model
# graphed beside a NaN guard measured 0.75x and 0.91x of eager, an evaluation loop rewritten whole 0.92x, where
# timings of the step alone (GPU_BOUND_SHARE, the model's side-by-side passes) had found a gain.
MIN_LOOP_GAIN = 1.03
TRIAL_BLOCK = 4  # calls per turn
TRIAL_BLOCKS = 6  # turns: 3 replayed, 3 eager (9 counted periods of each kind)
TRIAL_MIN_PERIODS = 3  # of each kind, for a verdict

# which tensors require grad: part of a graph's key, as autograd records only their backward
requires_grad = operator.attrgetter("requires_grad")
# a module's train/eval mode: part of a graph's key
is_training = operator.attrgetter("training")
# what a static input buffer takes in: a tensor of the same shape, dtype and device
tensor_signature = operator.attrgetter("shape", "dtype", "device")


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


# ---- timings -----------------------------------------------------------------------------------


def capture_forced() -> bool:
    """GRAPHIFY_CAPTURE=always: capture whatever the timings say."""
    return os.environ.get("GRAPHIFY_CAPTURE") == "always"


class Timing:
    """Host and GPU time of work launched on one stream, from the host's clock and two CUDA events on
    the stream. The GPU's time between the events includes its waits for the host's launches, so
    launch-bound work measures about its host time and GPU-bound work its kernels' time."""

    def __init__(self, stream: torch.cuda.Stream):
        self.stream = stream
        self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.start.record(stream)
        self.started = time.perf_counter()
        self.host_s = 0.0

    def stop(self) -> None:
        self.end.record(self.stream)
        self.host_s = time.perf_counter() - self.started

    def done(self) -> bool:
        """Whether the GPU has reached the end (no wait)."""
        return self.end.query()

    def milliseconds(self) -> tuple[float, float]:
        """(GPU ms, host ms); waits until the GPU has reached the end, if it has not yet."""
        if not self.end.query():
            self.end.synchronize()
        return self.start.elapsed_time(self.end), self.host_s * 1e3


class WarmupLoad:
    """Whether a wrapper's work is GPU-bound, from its warmup calls, decided before its first capture: each
    timed call's Timing (`add`), read once the GPU has run it (Timing.done: no wait), and at the first
    decision (`verdict`) after one wait for the last (a capture that goes ahead waits for the GPU anyway).
    Each call is timed on its own stream: no synchronisation around it."""

    def __init__(self):
        self.pending: list = []  # (Timing, recorded) not read yet
        self.samples: list = []  # (GPU ms, host ms, recorded)
        self.timed = 0  # calls timed
        self.asked = 0  # decisions asked

    def add(self, timing, recorded: bool = False) -> None:
        """A timed warmup call (`recorded`: the host-value recorder ran in it, slowing the host)."""
        self.pending.append((timing, recorded))
        self.timed += 1

    def read(self, wait: bool) -> None:
        """The timings the GPU has run (all of them when `wait`: one wait, for the last) moved to the samples."""
        if wait and self.pending:
            self.pending[-1][0].milliseconds()  # a stream runs in order: the earlier ones are done then too
        while self.pending and (wait or self.pending[0][0].done()):
            timing, recorded = self.pending.pop(0)
            self.samples.append((*timing.milliseconds(), recorded))

    def verdict(self, what: str) -> tuple[str, str | None]:
        """("capture", None); ("eager", why): GPU-bound; or ("time", None): this call runs eagerly, timed,
        and the next one asks again."""
        self.read(wait=False)
        decided = load_verdict(self.samples, what)
        if decided is None and self.pending and (self.asked == 0 or self.timed >= LOAD_CALLS):
            self.read(wait=True)
            decided = load_verdict(self.samples, what)
        self.asked += 1
        if decided is not None:
            return decided
        return ("capture", None) if self.timed >= LOAD_CALLS else ("time", None)


def load_verdict(samples, what: str) -> tuple[str, str | None] | None:
    """The decision from the timed warmup calls read so far, (GPU ms, host ms, recorded) each: capture when
    one run without the recorder was not GPU-bound (its host time at least GPU_BOUND_SHARE of its GPU time),
    eager with the reason when GPU_BOUND_CALLS were GPU-bound; None: not yet known."""
    if any(host >= GPU_BOUND_SHARE * gpu and not recorded for gpu, host, recorded in samples):
        return "capture", None
    bound = [(gpu, host) for gpu, host, _ in samples if host < GPU_BOUND_SHARE * gpu]
    if len(bound) < GPU_BOUND_CALLS:
        return None
    return "eager", gpu_bound(statistics.median(g for g, _ in bound), statistics.median(h for _, h in bound), what, len(bound))


def gpu_bound(gpu_ms: float, host_ms: float, what: str, calls: int) -> str:
    """Why `what` stays eager when the GPU sets its pace: `calls` warmup calls, their median times."""
    return (
        f"no gain expected: GPU-bound ({what} keeps the GPU busy {gpu_ms:.1f} ms for {host_ms:.1f} ms of host time, "
        f"medians of {calls} warmup calls each under {GPU_BOUND_SHARE:.0%}; GRAPHIFY_CAPTURE=always captures it anyway)"
    )


class LoopTrial:
    """Whether replays pay in the loop that calls them, measured there: after a capture, calls that would
    replay run in turns of TRIAL_BLOCK replayed and TRIAL_BLOCK eager calls (TRIAL_BLOCKS turns in all),
    and each call's period (from its start to the next call's start, on the host's clock and on the GPU's
    between two events on the stream) is kept. The period holds everything the loop does around the call
    (the rest of the step, a NaN guard's host read, the data loader, a logging sync), the replay path's own
    work (input copies, checks, output copies) and, on the GPU's clock, the kernels queued behind the host;
    a call costs the longer of its median host and median GPU period. The first period of each turn (the
    switch) and periods across a re-entry of the loop (`restart`) are not counted.
    `begin()` at the start of each call that could replay; `verdict()` once it returns None."""

    def __init__(self, clock=time.perf_counter, event=None):
        self.clock = clock
        self.event = event  # () -> a recorded GPU event with elapsed_time(); None: host clock only (CPU tests)
        self.calls = 0  # trial calls marked so far
        self.last = None  # (kind, host seconds, GPU event, counted) of the last marked call
        self.periods: dict = {"replay": [], "eager": []}  # kind -> [(host ms, GPU event pair or GPU ms)]

    def begin(self) -> str | None:
        """A call starts: what it runs ("replay" or "eager": turns of each, replayed first), or None once
        the trial is over (its last period closed by this call): then `verdict` decides."""
        kind = None if self.calls == TRIAL_BLOCK * TRIAL_BLOCKS else ("eager" if (self.calls // TRIAL_BLOCK) % 2 else "replay")
        self.mark(kind)
        return kind

    def mark(self, kind: str | None) -> None:
        """A call of `kind` starts now (the call after the last turn only closes the last period)."""
        now, event = self.clock(), self.event() if self.event is not None else None
        if self.last is not None:
            last_kind, started, started_event, counted = self.last
            if counted:
                self.periods[last_kind].append(((now - started) * 1e3, (started_event, event)))
        counted = self.calls % TRIAL_BLOCK != 0  # the first call of a turn follows the switch
        self.last = (kind, now, event, counted)
        self.calls += 1

    def restart(self) -> None:
        """The loop was entered again: the next period does not reach back to the last call."""
        self.last = None

    def costs(self) -> tuple[float, float]:
        """(eager ms, replay ms) per call: the longer of the median host and median GPU periods."""
        return _cost(self.periods["eager"]), _cost(self.periods["replay"])

    def verdict(self, what: str) -> str | None:
        """Why `what` stays eager (its replays are not faster in the loop than eager calls), or None. A
        loop entered again for every call or two (one full-batch step per epoch) leaves too few periods
        to tell: its graphs are kept, as before the trial."""
        if min(len(self.periods["replay"]), len(self.periods["eager"])) < TRIAL_MIN_PERIODS:
            return None
        return slower_in_loop(*self.costs(), what, len(self.periods["replay"]))


def _cost(periods) -> float:
    host = statistics.median(h for h, _ in periods) if periods else math.inf
    gpu = [_gpu_ms(g) for _, g in periods]
    gpu = [g for g in gpu if g is not None]
    return max(host, statistics.median(gpu)) if gpu else host


def _gpu_ms(g) -> float | None:
    if isinstance(g, (int, float)):
        return float(g)
    start, end = g
    if start is None or end is None:
        return None
    end.synchronize()
    return start.elapsed_time(end)


def slower_in_loop(eager_ms: float, replay_ms: float, what: str, samples: int) -> str | None:
    """Why replays that take `replay_ms` per call of the loop are given up for eager calls that take
    `eager_ms`: None when they are at least MIN_LOOP_GAIN times faster."""
    if eager_ms >= MIN_LOOP_GAIN * replay_ms:
        return None
    return (
        f"no gain expected: measured in its loop, {what} took {replay_ms:.3f} ms a call replayed and {eager_ms:.3f} ms eager "
        f"(medians of {samples} calls each, in turns; graphs are kept from {MIN_LOOP_GAIN:.2f}x faster; GRAPHIFY_CAPTURE=always keeps them)"
    )


def trial_event(device):
    """A GPU event recorded now on `device`'s current stream, for a trial's GPU periods."""

    def record():
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        return event

    return record


# ---- what a failed capture may have touched -----------------------------------------------------


@contextlib.contextmanager
def collection_paused():
    """Python's garbage collector held off during a capture: graphs left in reference cycles (a graphed model
    dropped with its module) collected mid-capture would be destroyed while the stream captures, which
    breaks the capture. torch.cuda.graph no longer collects before capturing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# Dropped graphs holding more device memory than this are collected at once; smaller ones wait (free_dropped_graphs).
LARGE_DROPPED_GRAPHS = 256 * 2**20
_dropped_graphs_pending = False


def free_dropped_graphs(held_bytes: int) -> None:
    """Dropped graphs sit in reference cycles (make_graphed_callables' autograd Function classes), which only
    the garbage collector frees. A full collection takes 0.1 to 0.3 s in a process that imported torch, more
    than a short loop gains, so it runs at once only where the graphs hold much device memory; otherwise
    right before the next fork (a DataLoader worker that inherited them would free CUDA memory it cannot
    touch, and abort) or at Python's own next collection, whichever comes first."""
    global _dropped_graphs_pending
    if held_bytes >= LARGE_DROPPED_GRAPHS:
        _dropped_graphs_pending = False
        gc.collect()
    else:
        _dropped_graphs_pending = True


def _collect_before_fork() -> None:
    global _dropped_graphs_pending
    if _dropped_graphs_pending:
        _dropped_graphs_pending = False
        gc.collect()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_collect_before_fork)


def save_host_state(parameters, device):
    """RNG states and the parameters' gradient references. The CUDA generator's state is kept as a copy
    of the state object: a capture that fails leaves the generator's own state marked as capturing, which
    only putting the copy back undoes."""
    generator = torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.get_rng_state(), (generator, generator.clone_state()), random.getstate(), [(p, p.grad) for p in parameters]


def restore_host_state(saved) -> None:
    cpu, (generator, cuda_state), py, grads = saved
    torch.set_rng_state(cpu)
    generator.graphsafe_set_state(cuda_state)
    random.setstate(py)
    for p, grad in grads:
        p.grad = grad


# ---- nested inputs and outputs -------------------------------------------------------------------


def leaves(value) -> list:
    """The tensors of a value made of tuples, lists, dicts, mappings and dataclasses, in order."""
    out: list = []
    _leaves(value, out, [])
    return out


TENSOR_TYPE = itertools.repeat(torch.Tensor)  # isinstance's second argument, for map: an endless one


def split(value) -> tuple[list, tuple]:
    """The tensors of a value, and everything else in it (numbers, flags, strings; other objects by
    identity): a capture is valid only for the host values it was captured with."""
    if type(value) is tuple and all(map(isinstance, value, TENSOR_TYPE)):  # the usual call: tensors alone
        return list(value), ()
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
        host.append(Identity(value))


class Identity:
    """An object in a graph's key, equal only to itself. It holds the object, so that while the key
    lives no later object can take its id (a criterion rebuilt each epoch must not replay the graph of
    the freed one)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other) -> bool:
        return type(other) is Identity and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


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
    """A copy of a replay's outputs that the next replay does not overwrite. Outputs that share storage (a
    `logits` and the `out` it is a view of) share the copy's storage too, as they did: an in-place change
    of one shows in the other."""
    shared: dict = {}
    for t in leaves(value):
        shared.setdefault(_storage_key(t), []).append(t)
    bases = {}
    for key, group in shared.items():
        if len(group) > 1 and key[0]:  # one copy of the whole storage, through autograd as clone() goes
            first = group[0]
            bases[key] = first.as_strided((first.untyped_storage().nbytes() // first.element_size(),), (1,), 0).clone()

    def copy(t):
        base = bases.get(_storage_key(t))
        if base is None:
            return t.clone()
        view = base.as_strided(t.size(), t.stride(), t.storage_offset())
        return view if t.requires_grad else view.detach()

    return tree_map(copy, value)


def _storage_key(t) -> tuple:
    return t.untyped_storage().data_ptr(), t.dtype, t.device


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"


# an error inside a capture breaks it; ending the capture then raises this, with the first error as context
_BROKEN_CAPTURE = "due to a previous error during capture"
# the backward waited on the default stream: a gradient accumulator of the model's parameters was made there
_KEPT_GRAPH = "legacy stream depend on a capturing"


def capture_failure(exc: BaseException) -> str:
    """Why a capture failed, in one line: the error that broke it (under a library's wrapping of it, `raise
    ... from`), and what to do where the user can."""
    if _BROKEN_CAPTURE in str(exc) and exc.__context__ is not None:
        exc = exc.__context__
    while exc.__cause__ is not None:
        exc = exc.__cause__
    why = f"capture failed ({type(exc).__name__}: {first_line(exc)})"
    if _KEPT_GRAPH in str(exc):
        why += (
            "; an autograd graph of the model made outside the step is still alive (an output computed with grad"
            " on and kept, such as an action picked from the model): compute it under torch.no_grad(), or delete it before the step"
        )
    return why


class Fetched:
    """The batches a micro-step loop in the step fetches, one per pass (`next(loader)` in each of `count`
    passes). The source fetches them between passes; a replay needs them all before it starts. So they
    are fetched on demand, in pass order, while the step runs eagerly (exactly as the source does: on a
    CPU, where the model's own random draws share the host's generator with the fetch, and during
    warmup), and all at once before a capture or replay. `watched`: record whether fetching moves a CUDA
    generator, since fetched ahead such draws would change places with the step's own."""

    def __init__(self, fetch, count: int):
        self.fetch = fetch
        self.count = count
        self.items: list = []
        self.watched = False
        self.moved_device_generator = False

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        while len(self.items) <= index:
            before = _device_offsets() if self.watched else None
            self.items.append(self.fetch())
            if before is not None and before != _device_offsets():
                self.moved_device_generator = True
        return self.items[index]

    def fetch_all(self) -> list:
        if self.count > 0:
            self[self.count - 1]
        return list(self.items)


def _device_offsets() -> tuple:
    return tuple(g.get_offset() for g in torch.cuda.default_generators)


def input_fit(statics: list):
    """Whether new inputs can be copied into the static buffers, as a function of the inputs: the same
    shapes, dtypes and devices (`tensor_signature` of each). Asked before every replay, so the usual answer
    comes from PyTorch's compiled tensor guards where this build has them (torch._C._dynamo.guards): the
    same sizes, strides, dtype, device and dispatch keys as the buffers, which implies a fit, checked in
    C++. Any other input (strided otherwise, requiring grad, a subclass) gets the plain comparison."""
    signature = list(map(tensor_signature, statics))
    exact, count = _compiled_guard(statics), len(statics)

    def fits(new: list) -> bool:
        return (exact is not None and len(new) == count and exact(*new)) or list(map(tensor_signature, new)) == signature

    return fits


def _compiled_guard(statics: list):
    """The `check` of a compiled guard of plain tensors like `statics`, or None where this build has none."""
    if not statics or any(type(t) is not torch.Tensor for t in statics):
        return None
    try:
        from torch._C._dynamo.guards import TensorGuards

        return TensorGuards(*statics, dynamic_dims_sizes=None, dynamic_dims_strides=None).check
    except (ImportError, AttributeError, TypeError, RuntimeError):  # a build without it, or another signature
        return None


def versions(tensors) -> list:
    """Each tensor's version counter, which every in-place change bumps, under capture too (None for an
    inference tensor, which keeps none)."""
    return [None if t.is_inference() else t._version for t in tensors]


def changed_in_place(tensors, before: list) -> tuple:
    """The indices of the tensors changed in place since their `versions` were `before`."""
    return tuple(i for i, (t, v) in enumerate(zip(tensors, before)) if v is not None and t._version != v)
