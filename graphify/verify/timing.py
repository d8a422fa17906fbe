"""Where a verified run's time goes: start-up, data wait, host-to-device copies, the step, host reads,
evaluation (other loops) and the rest, and what CUDA graph capture can win of it.

The child (child.py) loads this file by path, so it imports only the standard library; it is handed
`torch`. The run's wall clock is cut into parts, each instant counted once:

* **start-up**: from the process start to the first entry of the probed loop;
* **the probed loop**, from then on: each stretch between one probe (or entry of the loop) and the
  next is one iteration. Time blocked in a DataLoader (its `__iter__` and `__next__`, or the `next()` of
  the loop's own iterable) is **data wait**; `.to`/`.cuda`/`copy_` from a host tensor to a CUDA one
  is a **host-to-device copy**; the rest of an iteration is the **step** (the time verify's ms / step
  measures, less these two). A host read (`.item()`, `.cpu()`...) inside an iteration waits for the
  step's own kernels: it counts as step (and is shown apart as "host reads in the step"). A stretch
  that ends at an entry of the loop instead of a probe is not an iteration (the code after the loop,
  between epochs): its host reads count as **host reads**, the rest as **rest**;
* **evaluation**: the time between the markers instrumentation puts around every other training or
  inference loop of the file (an evaluation loop), whatever runs there;
* what verify itself does at a probe (recording, saving and loading states) and the profiled steps,
  which the profiler slows, belong to no part: they are left out of the whole run.

Only the outermost wrapped call of the main thread is timed; a wrapped call inside another (a copy in
a Dataset's `__getitem__` during `__next__`) counts as the outer one. A wrapper hands each call to the
original unchanged (and at once while torch.compile traces), so what the script computes is the same.
"""

from __future__ import annotations

import functools
import threading
import time

STARTUP, DATA, H2D, STEP, HOST_READ, EVALUATION, REST = "startup", "data_wait", "h2d_copies", "step", "host_reads", "evaluation", "rest"
PAGEABLE_NOTE_SHARE = 0.05  # a share of the run after start-up that copies from pageable memory worth a word
PAGEABLE_H2D = "h2d_pageable"  # a host-to-device copy from pageable memory: counted as H2D, and apart
PARTS = (STARTUP, DATA, H2D, STEP, HOST_READ, EVALUATION, REST)
AFTER_STARTUP = PARTS[1:]  # the parts of the run the verdict weighs
LABELS = {
    STARTUP: "start-up",
    DATA: "data wait",
    H2D: "host-to-device copies",
    STEP: "step",
    HOST_READ: "host reads",
    EVALUATION: "evaluation (other loops)",
    REST: "rest",
}

_STARTING, _LOOP, _EVALUATING, _PAUSED, _STOPPED = range(5)


class TimeSplit:
    """The parts of one run's wall clock, fed by the probe (`enter`, `step_end`, `resume`, `stop`), the
    markers around other loops (`other`, `other_end`) and the wrappers (`call`). Times are `clock()`
    readings; `origin` is the process start on the same clock."""

    def __init__(self, origin: float, clock=time.perf_counter) -> None:
        self.clock, self.origin = clock, origin
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.reads_in_step = 0.0  # host reads inside iterations, counted in the step
        self.pageable = 0.0  # host-to-device copies from pageable memory, counted in H2D
        self.excluded = 0.0  # verify's own work at the probes, and the profiled steps
        self.steps = 0  # iterations counted
        self.timing = False  # whether the wrappers time calls now: in the probed loop, not paused
        self.depth = 0  # a timed call in progress (its inner wrapped calls are part of it)
        self.main = threading.get_ident()
        self.end: float | None = None
        self._state = _STARTING
        self._since = origin  # start of the stretch not yet counted
        self._pending = 0.0  # loop time since the last probe or entry: step, or rest after the loop
        self._pending_reads = 0.0  # host reads in it
        self._paused_at = 0.0
        self._others: list[int] = []  # other loops open (their lines), outermost first

    # ---- the probed loop ------------------------------------------------------------------------

    def enter(self, t: float) -> None:
        """The probed loop is entered: start-up ends, or the stretch since the last probe was no iteration."""
        if self._state == _STARTING:
            self.seconds[STARTUP] = t - self.origin
        elif self._state in (_LOOP, _EVALUATING):
            self._close(t)
            self._resolve(REST)
        else:
            return
        self._run(t)

    def step_end(self, t: float) -> None:
        """A probe, after the step's kernels finished: the iteration ends; verify's own work starts (paused)."""
        if self._state == _STARTING:  # a probe before any entry: the first iteration is start-up
            self.seconds[STARTUP] = t - self.origin
        elif self._state in (_LOOP, _EVALUATING):
            self._close(t)
            self._resolve(STEP)
            self.steps += 1
        else:
            return
        self._state, self._paused_at, self.timing = _PAUSED, t, False

    def resume(self, t: float) -> None:
        """Verify's work at a probe (or the profiled steps) is over: the script runs again."""
        if self._state == _PAUSED:
            self.excluded += t - self._paused_at
            self._run(t)

    def stop(self, t: float) -> None:
        """The end of the window: the last probe (verify stopped the script) or the script's own end."""
        if self._state == _STOPPED:
            return
        if self._state == _PAUSED:
            t = self._paused_at
        elif self._state == _STARTING:
            self.seconds[STARTUP] = t - self.origin
        else:
            self._close(t)
            self._resolve(REST)
        self._state, self.end, self.timing = _STOPPED, t, False

    # ---- other loops ----------------------------------------------------------------------------

    def other(self, line: int, t: float) -> None:
        """Another loop of the file starts (before its first iteration)."""
        if self._state == _LOOP:
            self._pending += t - self._since
            self._state, self._since, self.timing = _EVALUATING, t, False
            self._others = [line]
        elif self._state == _EVALUATING:
            self._others.append(line)

    def other_end(self, line: int, t: float) -> None:
        """That loop ended (a `return` or `break` out of it skips this: the next entry or probe ends it)."""
        if self._state != _EVALUATING or line not in self._others:
            return
        del self._others[self._others.index(line) :]
        if not self._others:
            self.seconds[EVALUATION] += t - self._since
            self._state, self._since, self.timing = _LOOP, t, True

    # ---- wrapped calls --------------------------------------------------------------------------

    def call(self, part: str, t0: float, t1: float) -> None:
        """A timed call of the main thread, from t0 to t1: data wait, a copy, or a host read."""
        if self._state != _LOOP or t0 < self._since:  # the loop's state changed during the call: it stays in that stretch
            return
        self._pending += t0 - self._since
        self._since = t1
        if part == HOST_READ:
            self._pending_reads += t1 - t0
            return
        if part == PAGEABLE_H2D:
            part = H2D
            self.pageable += t1 - t0
        self.seconds[part] += t1 - t0

    def iterate(self, iterable):
        """The probed loop's own iterable (`for x in __graphify_probe__.data(loader)`): the same items, in
        the same order, its `iter()` and each `next()` timed as data wait."""
        it = self._timed_data(iter, iterable)
        while True:
            try:
                item = self._timed_data(next, it)
            except StopIteration:
                return
            yield item

    def _timed_data(self, fn, arg):
        if not self.timing or self.depth or threading.get_ident() != self.main:
            return fn(arg)
        self.depth = 1
        t0 = self.clock()
        try:
            return fn(arg)
        finally:
            self.depth = 0
            self.call(DATA, t0, self.clock())

    # ---- bookkeeping ----------------------------------------------------------------------------

    def _run(self, t: float) -> None:
        self._state, self._since, self.timing = _LOOP, t, True
        self._pending = self._pending_reads = 0.0
        self._others = []

    def _close(self, t: float) -> None:
        """Count the open stretch up to t: an open other loop is evaluation, the rest pending."""
        if self._state == _EVALUATING:
            self.seconds[EVALUATION] += t - self._since
        else:
            self._pending += t - self._since
        self._since = t

    def _resolve(self, part: str) -> None:
        """The pending loop time was an iteration (STEP) or the code around the loop (REST)."""
        if part == STEP:
            self.seconds[STEP] += self._pending + self._pending_reads
            self.reads_in_step += self._pending_reads
        else:
            self.seconds[REST] += self._pending
            self.seconds[HOST_READ] += self._pending_reads
        self._pending = self._pending_reads = 0.0

    def summary(self) -> dict:
        """The JSON of `runs.<version>.time_split` (docs/verify.md)."""
        if self.end is None:
            self.stop(self.clock())
        return {
            "whole_s": self.end - self.origin - self.excluded,
            "seconds": dict(self.seconds),
            "host_reads_in_step_s": self.reads_in_step,
            "h2d_pageable_s": self.pageable,
            "steps": self.steps,
            "excluded_s": self.excluded,
        }


# ---- the wrappers -------------------------------------------------------------------------------


def install(torch, split: TimeSplit, on_device=None):
    """Time, on the main thread, what waits for data, copies to the GPU or reads from it; returns a
    function that takes the wrappers off again. `on_device(tensor)`: whether a tensor lives on the
    GPU (tests pass another)."""
    on_device = on_device or (lambda t: t.is_cuda)
    undo = []

    def device(t) -> bool:
        return bool(on_device(t)) if isinstance(t, torch.Tensor) else False

    def upload(source) -> str:
        """A host-to-device copy, told apart when its source is in pageable memory."""
        return H2D if isinstance(source, torch.Tensor) and source.is_pinned() else PAGEABLE_H2D

    def to(args, kwargs, result):
        if result is None:
            return None
        src, dst = device(args[0]), device(result)
        return upload(args[0]) if dst and not src else HOST_READ if src and not dst else None

    def copy(args, kwargs, result):
        source = args[1] if len(args) > 1 else kwargs.get("src")
        dst, src = device(args[0]), device(source)
        return upload(source) if dst and not src else HOST_READ if src and not dst else None

    def read(args, kwargs, result):
        return HOST_READ if device(args[0]) else None

    def cuda(args, kwargs, result):
        return upload(args[0]) if result is not None and not device(args[0]) else None

    tensor = torch.Tensor
    for name, classify in (
        ("to", to),
        ("cuda", cuda),
        ("copy_", copy),
        ("cpu", read),
        ("item", read),
        ("tolist", read),
        ("numpy", read),
        ("__float__", read),
        ("__int__", read),
        ("__bool__", read),
    ):
        undo.append(_wrap(torch, split, tensor, name, classify))
    if torch.cuda.is_available():
        undo.append(_wrap(torch, split, torch.cuda, "synchronize", lambda args, kwargs, result: HOST_READ))
    from torch.utils.data import dataloader

    undo.append(_wrap(torch, split, dataloader.DataLoader, "__iter__", lambda args, kwargs, result: DATA))
    undo.append(_wrap(torch, split, dataloader._BaseDataLoaderIter, "__next__", lambda args, kwargs, result: DATA))

    def uninstall() -> None:
        for restore in reversed(undo):
            restore()

    return uninstall


def _wrap(torch, split: TimeSplit, owner, name: str, classify):
    """Replace owner.name by a wrapper that times the outermost call of the main thread and counts it
    as classify(args, kwargs, result) says (None: not a part of its own; the result is None when the call
    raised). Returns what undoes it."""
    original = getattr(owner, name)
    had = name in vars(owner)
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
    clock, get_ident = split.clock, threading.get_ident

    def timed(*args, **kwargs):
        # first: torch.compile traces straight through to the original, reading none of the state below
        if compiling() or not split.timing or split.depth or get_ident() != split.main:
            return original(*args, **kwargs)
        split.depth = 1
        result = None
        t0 = clock()
        try:
            result = original(*args, **kwargs)
            return result
        finally:
            split.depth = 0
            t1 = clock()
            try:
                part = classify(args, kwargs, result)
            except Exception:  # never fail the script for the time split
                part = None
            if part is not None:
                split.call(part, t0, t1)

    try:
        functools.update_wrapper(timed, original)
    except (AttributeError, TypeError):
        pass
    setattr(owner, name, timed)

    def restore() -> None:
        if had:
            setattr(owner, name, original)
        else:
            delattr(owner, name)

    return restore


# ---- what the parts say -------------------------------------------------------------------------


def shares(summary: dict) -> dict | None:
    """Each part's share of the run after start-up (None when nothing ran after it)."""
    seconds = summary["seconds"]
    loop = sum(seconds[p] for p in AFTER_STARTUP)
    if loop <= 0:
        return None
    return {p: seconds[p] / loop for p in AFTER_STARTUP}


_BOUND = {
    DATA: ("data-bound", "waits for the data loader"),
    H2D: ("copy-bound", "copies batches from the host to the GPU"),
    HOST_READ: ("sync-bound", "waits on host reads of GPU values outside the step (.item(), .cpu()...)"),
    EVALUATION: ("evaluation-bound", "runs other loops (evaluation)"),
    REST: ("bound by the code around the loop", "runs the script's own code between loop entries (epoch ends, checkpoints)"),
}


def verdict(summary: dict, gpu_busy: float | None = None) -> str | None:
    """What capture can win: it shrinks launch overhead inside the step only, so the most it saves is the
    step's share of the run after start-up. `gpu_busy`: the share of the eager step the GPU ran kernels
    (the profile), which tells a launch-bound step from a GPU-bound one."""
    share = shares(summary)
    if share is None:
        return None
    return _bound(share, gpu_busy) + _pageable_note(summary)


def _pageable_note(summary: dict) -> str:
    """What copies from pageable memory cost, where they take a visible share of the run (5% or more)."""
    loop = sum(summary["seconds"][p] for p in AFTER_STARTUP)
    pageable = summary.get("h2d_pageable_s", 0.0) / loop
    if pageable < PAGEABLE_NOTE_SHARE:
        return ""
    return (
        f"; {pageable:.0%} of it copies batches from pageable memory, through the driver's staging buffer"
        " while the CPU waits (DataLoader(..., pin_memory=True) pins them in a background thread)"
    )


def _bound(share: dict, gpu_busy: float | None) -> str:
    top = max(AFTER_STARTUP, key=lambda p: share[p])
    bound = f"capture saves at most {share[STEP]:.0%} (the step's share)"
    if top != STEP:
        label, what = _BOUND[top]
        return f"{label}: {share[top]:.0%} of the run after start-up {what}; {bound}"
    head = f"{share[STEP]:.0%} of the run after start-up is the step"
    if gpu_busy is None:
        return f"step-bound: {head}; {bound}"
    if gpu_busy >= 0.9:
        return f"GPU-bound: {head}, where the GPU runs kernels {gpu_busy:.0%} of the time; {bound}, little of it here"
    if gpu_busy <= 0.5:
        return f"launch-bound: {head}, where the GPU runs kernels only {gpu_busy:.0%} of the time; {bound}"
    return f"step-bound: {head}, where the GPU runs kernels {gpu_busy:.0%} of the time; {bound}"
