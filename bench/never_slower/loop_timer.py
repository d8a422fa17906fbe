"""The timing the never-slower scripts share (whole_step.py, nan_guard_model.py, eval_loop.py): the whole loop
from its first step (warmup, capture and the runtime's trial included) and its second half, the steady steps,
each from and to a point where the GPU has finished its work. run.py reads the line `report` prints.

Only the halfway mark is called from inside a loop, behind the script's own `if`: the steps pay for no call."""

import time

import torch


_sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


class LoopTimer:
    def __init__(self, steps: int):
        """Started at once: make it right before the loop."""
        self.steps = steps
        self.half = self.ended = None
        _sync()
        self.started = time.perf_counter()

    def halfway(self) -> None:
        """Call when step `steps // 2` is done."""
        _sync()
        self.half = time.perf_counter()

    def stop(self) -> None:
        """Call right after the loop, before the script reads its results."""
        _sync()
        self.ended = time.perf_counter()

    def report(self) -> None:
        """Prints the whole loop's seconds and the second half's milliseconds a step (after the script's own
        result line: run.py takes the first line printed for the result)."""
        steady = (self.ended - self.half) * 1e3 / (self.steps - self.steps // 2)
        print(f"loop s {self.ended - self.started:.4f} steady ms/step {steady:.4f}")
