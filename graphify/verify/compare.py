"""Are two runs the same training? Each step compared from identical state (teacher forcing).

The rewrite runs on the original's trajectory (forcing.py): before each step it loads the original's
state after the step before. So each compared step starts from identical parameters, optimizer state,
buffers and RNG states, and its differences are one step's rounding, never compounded:

* the step's outputs (losses; for inference loops, output sums): |a - b| <= atol + rtol * |a|;
* the state after the step (parameters, optimizer state, buffers): ||rewrite - original|| divided by
  ||original after - original before||, i.e. relative to how far the step moved them, within the
  update tolerance. Step 1 starts from the same seeded state in both runs and is compared too.

On the CPU every tolerance is 0: the rewrite runs the same eager code. docs/verify.md derives the CUDA
tolerances and reports the margins measured against planted bugs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# On CUDA, by the narrowest type the step computes in: (loss rtol, loss atol, update tolerance)
CUDA_TOLERANCES = {
    "float64": (1e-5, 1e-7, 1e-3),
    "float32": (1e-5, 1e-7, 1e-3),
    "float16": (2e-3, 1e-6, 5e-2),
    "bfloat16": (1e-2, 1e-6, 5e-2),
}


@dataclass
class Diff:
    compared: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst: str | None = None  # the value (step or tensor name) with the largest relative difference
    first_bad: str | None = None  # the first value outside the tolerance
    problems: list[str] = field(default_factory=list)  # missing values, shape changes...
    abs_by_name: dict[str, float] = field(default_factory=dict)
    max_ratio: float = 0.0  # the largest difference as a multiple of what the tolerance allows

    @property
    def ok(self) -> bool:
        return self.first_bad is None and not self.problems

    def add(self, name: str, abs_diff: float, ref: float, rtol: float, atol: float) -> None:
        self.compared += 1
        if math.isnan(abs_diff):
            abs_diff = math.inf
        rel = abs_diff / ref if ref > 0 else (0.0 if abs_diff == 0 else math.inf)
        if rel > self.max_rel:
            self.max_rel, self.worst = rel, name
        self.max_abs = max(self.max_abs, abs_diff)
        self.abs_by_name[name] = abs_diff
        allowed = atol + rtol * ref
        self.max_ratio = max(self.max_ratio, abs_diff / allowed if allowed > 0 else (0.0 if abs_diff == 0 else math.inf))
        if abs_diff > allowed and self.first_bad is None:
            self.first_bad = name

    def to_dict(self) -> dict:
        return {
            "compared": self.compared,
            "max_abs_diff": _num(self.max_abs),
            "max_rel_diff": _num(self.max_rel),
            "worst": self.worst,
            "first_mismatch": self.first_bad,
            "problems": self.problems,
            "ok": self.ok,
            "max_tolerance_ratio": _num(self.max_ratio),
        }


@dataclass
class Comparison:
    rtol: float
    atol: float
    update_tol: float
    exact: bool
    steps: tuple[int, int]  # (original, rewrite)
    losses: Diff
    params: Diff  # per compared step: parameter difference relative to the step's update
    state: Diff  # per compared step: optimizer state and buffers, likewise
    forced: int = 0  # steps the rewrite ran from the original's state

    @property
    def equivalent(self) -> bool:
        return self.steps[0] == self.steps[1] and self.losses.ok and self.params.ok and self.state.ok

    def first_divergent_step(self) -> int | None:
        """1-based step of the first loss outside the tolerance."""
        return int(self.losses.first_bad.split()[1]) if self.losses.first_bad else None


def tolerances(on_cuda: bool, precision: str, rtol: float | None, atol: float | None) -> tuple[float, float, float]:
    """(loss rtol, loss atol, update tolerance): exact on the CPU, by precision on CUDA. A given rtol also
    bounds the state's difference relative to each step's update."""
    default = CUDA_TOLERANCES.get(precision, CUDA_TOLERANCES["float32"]) if on_cuda else (0.0, 0.0, 0.0)
    return (default[0] if rtol is None else rtol, default[1] if atol is None else atol, default[2] if rtol is None else rtol)


def compare_runs(original, rewrite, rtol: float, atol: float, update_tol: float) -> Comparison:
    """`original` and `rewrite`: runner.RunResult of each version, the rewrite forced onto the original's states."""
    forced = rewrite.data.get("forced") or {"steps": [], "metrics": {}}
    compared = {1} | {k for k in forced["steps"] if k <= min(original.steps, rewrite.steps)}
    a, b = original.data.get("values", []), rewrite.data.get("values", [])
    losses = compare_values(a, b, rtol, atol, steps=compared)
    params, state = Diff(), Diff()
    for k, m in sorted(((int(k), m) for k, m in forced["metrics"].items())):
        if "params" in m:
            params.add(f"step {k}", m["params"], 1.0, 0.0, update_tol)
        for part in ("optim", "buffers"):
            if part in m:
                state.add(f"step {k} {'optimizer state' if part == 'optim' else 'buffers'}", m[part], 1.0, 0.0, update_tol)
    return Comparison(
        rtol,
        atol,
        update_tol,
        rtol == 0 and atol == 0 and update_tol == 0,
        (original.steps, rewrite.steps),
        losses,
        params,
        state,
        len(compared) - 1,
    )


def compare_values(a: list[list[float]], b: list[list[float]], rtol: float, atol: float, steps: set[int] | None = None) -> Diff:
    """Per-step values the probe recorded (losses; for inference loops, output sums), at `steps` (all by default)."""
    diff = Diff()
    for step, (va, vb) in enumerate(zip(a, b), 1):
        if steps is not None and step not in steps:
            continue
        if len(va) != len(vb):
            diff.problems.append(f"step {step}: {len(va)} values in the original, {len(vb)} in the rewrite")
            continue
        for k, (x, y) in enumerate(zip(va, vb)):
            name = f"step {step}" + (f" value {k + 1}" if len(va) > 1 else "")
            same = x == y or (math.isnan(x) and math.isnan(y))  # inf == inf too
            diff.add(name, 0.0 if same else abs(x - y), abs(x), rtol, atol)
    return diff


def _num(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else x
