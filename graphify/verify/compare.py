"""Are two runs the same training? Per-step losses, final parameters, final optimizer state.

A value passes when |a - b| <= atol + rtol * |a| (a: the original). Tensors compare by norm:
||a - b|| <= atol + rtol * ||a||, and the relative difference reported is ||a - b|| / ||a||.
With rtol = atol = 0 every value must be identical (NaN matches NaN).

A noise run (the original again, its parameters nudged by one ulp after step 1) measures how far
rounding alone moves each value; `NOISE_FACTOR` times that is allowed on top of the tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# (rtol, atol) on CUDA by the narrowest type the step computes in; docs/verify.md says why not exact
CUDA_TOLERANCES = {"float64": (1e-4, 1e-6), "float32": (1e-4, 1e-6), "float16": (1e-3, 1e-5), "bfloat16": (1e-2, 1e-5)}
NOISE_FACTOR = 10


@dataclass
class Diff:
    compared: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst: str | None = None  # the value (step or tensor name) with the largest relative difference
    first_bad: str | None = None  # the first value outside the tolerance
    problems: list[str] = field(default_factory=list)  # missing values, shape changes...
    abs_by_name: dict[str, float] = field(default_factory=dict)
    slack: dict[str, float] = field(default_factory=dict)  # rounding noise of each value, from a noise run

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
        if abs_diff > atol + rtol * ref + NOISE_FACTOR * self.slack.get(name, 0.0) and self.first_bad is None:
            self.first_bad = name

    def to_dict(self) -> dict:
        return {"compared": self.compared, "max_abs_diff": _num(self.max_abs), "max_rel_diff": _num(self.max_rel),
                "worst": self.worst, "first_mismatch": self.first_bad, "problems": self.problems, "ok": self.ok}


@dataclass
class Comparison:
    rtol: float
    atol: float
    exact: bool
    steps: tuple[int, int]  # (original, rewrite)
    losses: Diff
    params: Diff
    state: Diff
    noise: "Comparison | None" = None  # the original against its nudged self, when it was needed

    @property
    def equivalent(self) -> bool:
        return self.steps[0] == self.steps[1] and self.losses.ok and self.params.ok and self.state.ok

    def first_divergent_step(self) -> int | None:
        """1-based step of the first loss outside the tolerance."""
        return int(self.losses.first_bad.split()[1]) if self.losses.first_bad else None


def tolerances(on_cuda: bool, precision: str, rtol: float | None, atol: float | None) -> tuple[float, float]:
    default_rtol, default_atol = CUDA_TOLERANCES.get(precision, CUDA_TOLERANCES["float32"]) if on_cuda else (0.0, 0.0)
    return (default_rtol if rtol is None else rtol, default_atol if atol is None else atol)


def compare_runs(original, rewrite, rtol: float, atol: float, noise: Comparison | None = None) -> Comparison:
    """`original` and `rewrite`: runner.RunResult of each version; `noise`: the original against a noise run."""
    def slack(part: str) -> dict:
        return getattr(noise, part).abs_by_name if noise else {}

    return Comparison(
        rtol, atol, rtol == 0 and atol == 0 and noise is None, (original.steps, rewrite.steps),
        compare_values(original.data.get("values", []), rewrite.data.get("values", []), rtol, atol, slack("losses")),
        compare_tensors(original.tensors.get("params", {}), rewrite.tensors.get("params", {}), rtol, atol, slack("params")),
        compare_tensors(original.tensors.get("state", {}), rewrite.tensors.get("state", {}), rtol, atol, slack("state")),
        noise,
    )


def compare_values(a: list[list[float]], b: list[list[float]], rtol: float, atol: float, slack=None) -> Diff:
    """Per-step values the probe recorded (losses; for inference loops, output sums)."""
    diff = Diff(slack=slack or {})
    for step, (va, vb) in enumerate(zip(a, b), 1):
        if len(va) != len(vb):
            diff.problems.append(f"step {step}: {len(va)} values in the original, {len(vb)} in the rewrite")
            continue
        for k, (x, y) in enumerate(zip(va, vb)):
            name = f"step {step}" + (f" value {k + 1}" if len(va) > 1 else "")
            same = x == y or (math.isnan(x) and math.isnan(y))  # inf == inf too
            diff.add(name, 0.0 if same else abs(x - y), abs(x), rtol, atol)
    return diff


def compare_tensors(a: dict, b: dict, rtol: float, atol: float, slack=None) -> Diff:
    import torch

    diff = Diff(slack=slack or {})
    for name in sorted(set(a) ^ set(b)):
        diff.problems.append(f"{name}: only in the {'original' if name in a else 'rewrite'}")
    for name in sorted(set(a) & set(b)):
        x, y = a[name], b[name]
        if x.shape != y.shape:
            diff.problems.append(f"{name}: shape {tuple(x.shape)} in the original, {tuple(y.shape)} in the rewrite")
            continue
        x, y = x.double(), y.double()
        same = (x == y) | (torch.isnan(x) & torch.isnan(y))  # inf == inf too
        delta = torch.where(same, 0.0, x - y)
        reference = torch.where(torch.isfinite(x), x, 0.0)
        diff.add(name, float(torch.linalg.vector_norm(delta)), float(torch.linalg.vector_norm(reference)), rtol, atol)
    return diff


def _num(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else x
