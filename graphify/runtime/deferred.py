"""Host reads one step later (`graphify rewrite --defer-host-reads`): what the statements that only log a
step's results read is held for one step, so that the host queues the next replay before it waits.

A rewritten loop ends each pass with

    for loss_host, step_host in train_step_reads.push(copy=(loss,), value=(step,)):
        print(f"step {step_host} loss {loss_host.item():.4f}")

and runs the same statements over `train_step_reads.flush()` when it ends (a `finally`). `push` holds this
step's values: tensors (`copy`) copied to host memory without waiting (pinned memory, `non_blocking`, an
event recorded on the current stream after the copy), tensors whose shape alone is read (`keep`) and
immutable values (`value`) as they are. It returns the entries to run now, oldest first: the previous step's,
whose copy was queued before this step's replay and so never waits for it. A value that cannot be held for a
step (a list, a module: it may change before it is read) makes `push` return every held entry and this one
at once, with this step's values as they are: the statements then run as without the option. A run left
unfinished (a deferred statement raised) drops what is still held, as the loop without the option would have
stopped before those steps' statements. Without CUDA the copies are clones: the values, and what the
statements print, are the same.
"""

from __future__ import annotations

import collections
import numbers

import torch


def _immutable(value) -> bool:
    if isinstance(value, tuple):
        return all(_immutable(v) for v in value)
    return value is None or isinstance(value, (numbers.Number, str, bytes)) and not isinstance(value, torch.Tensor)


def _held(value) -> bool:
    return _immutable(value) or (isinstance(value, torch.Tensor) and value.layout == torch.strided)


def _to_host(values: tuple) -> tuple[list, list]:
    """Each tensor copied to host memory (CUDA: pinned, without waiting); the events to wait on before reading."""
    copies, events = [], {}
    for value in values:
        if not isinstance(value, torch.Tensor):
            copies.append(value)
            continue
        source = value.detach()
        if source.is_cuda:
            host = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
            host.copy_(source, non_blocking=True)
            events.setdefault(source.device, None)
        else:
            host = source.clone() if source.device.type == "cpu" else source.cpu()
        copies.append(host)
    recorded = []
    for device in events:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        recorded.append(event)
    return copies, recorded


class _Run:
    """The entries push or flush hands back, run by the loop over them; until it is done it is the reads' open run."""

    def __init__(self, reads: "DeferredReads", entries: list[tuple]) -> None:
        self._reads, self._entries = reads, iter(entries)
        reads._open = self

    def __iter__(self) -> "_Run":
        return self

    def __next__(self) -> tuple:
        try:
            return next(self._entries)
        except StopIteration:
            self._reads._open = None
            raise


class DeferredReads:
    """The values the deferred statements of one loop read, held one step (see the module docstring)."""

    def __init__(self) -> None:
        self._pending: collections.deque[tuple[tuple, list]] = collections.deque()
        self._open: _Run | None = None

    def push(self, copy: tuple = (), keep: tuple = (), value: tuple = ()) -> _Run:
        """Hold this step's values; the entries to run now, oldest first (each `(*copy, *keep, *value)`)."""
        if not (all(_held(v) for v in copy) and all(_held(v) for v in keep) and all(_immutable(v) for v in value)):
            return _Run(self, [*self._drain(), (*copy, *keep, *value)])
        copies, events = _to_host(copy)
        self._pending.append(((*copies, *keep, *value), events))
        return _Run(self, [self._take() for _ in range(len(self._pending) - 1)])

    def flush(self) -> _Run:
        """Every entry still held, oldest first: at the loop's end, however it ends; none after a run that a
        deferred statement left unfinished (it raised)."""
        if self._open is not None:
            self._pending.clear()
        return _Run(self, self._drain())

    def _drain(self) -> list[tuple]:
        return [self._take() for _ in range(len(self._pending))]

    def _take(self) -> tuple:
        values, events = self._pending.popleft()
        for event in events:
            event.synchronize()
        return values
