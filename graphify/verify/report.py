"""The outcome of `graphify verify`: plain data, the speed verdict, and the JSON document."""

from __future__ import annotations

from dataclasses import dataclass, field

from graphify.verify import timing
from graphify.verify.runner import SETUP_STEPS

PASSED, FAILED, ERROR = 0, 1, 2  # exit codes: equivalent / not equivalent / could not run
SCHEMA_VERSION = 2  # of the JSON document: 2 added time_split and time_verdict (docs/verify.md)


@dataclass
class VerifyReport:
    path: str
    steps_requested: int
    args: list[str] = field(default_factory=list)
    exit_code: int = ERROR
    message: str = ""
    detail: str = ""  # stderr tail of a failed run
    loop: dict | None = None  # {"line", "kind", "function", "step_function", "records_values"}
    original: object | None = None  # runner.RunResult
    rewrite: object | None = None
    comparison: object | None = None  # compare.Comparison
    workdir: str | None = None  # kept files (--keep)
    warnings: list[str] = field(default_factory=list)  # what the run did not cover

    @property
    def passed(self) -> bool:
        return self.exit_code == PASSED

    @property
    def status(self) -> str:
        return {PASSED: "passed", FAILED: "failed"}.get(self.exit_code, "error")

    @property
    def on_cuda(self) -> bool:
        return bool(self.original is not None and self.original.data.get("on_cuda"))

    @property
    def speedup(self) -> float | None:
        if not self.on_cuda or self.original is None or self.rewrite is None:
            return None
        a, b = self.original.step_ms, self.rewrite.step_ms
        return a / b if a and b else None

    @property
    def verdict(self) -> str | None:
        if self.original is None or self.rewrite is None or not self.rewrite.ok:
            return None
        return speed_verdict(self)

    @property
    def time_verdict(self) -> str | None:
        """Where the original's time goes, and the most capture can save of it (timing.verdict)."""
        if self.original is None or self.rewrite is None or not self.rewrite.ok:
            return None
        split = self.original.data.get("time_split")
        if not split:
            return None
        busy = (self.original.data.get("profile") or {}).get("gpu_busy_share")
        text = timing.verdict(split, busy if self.on_cuda else None)
        if text is None:
            return None
        rewrite = self.rewrite.data.get("time_split")
        if rewrite and rewrite["steps"] == split["steps"]:  # the same steps: what the rewrite took for them
            after = [sum(s["seconds"][p] for p in timing.AFTER_STARTUP) for s in (split, rewrite)]
            text += f"; after start-up the original took {after[0]:.3g} s, the rewrite {after[1]:.3g} s"
        return text if self.on_cuda else "on the CPU, where nothing is captured: " + text

    def to_dict(self) -> dict:
        c = self.comparison
        doc = {
            "schema_version": SCHEMA_VERSION,
            "path": self.path,
            "status": self.status,
            "exit_code": self.exit_code,
            "message": self.message,
            "detail": self.detail or None,
            "warnings": self.warnings,
            "steps_requested": self.steps_requested,
            "args": self.args,
            "loop": self.loop,
            "device": self.original.data.get("device") if self.original is not None and self.original.ok else None,
            "on_cuda": self.on_cuda,
            "tolerance": {
                "rtol": c.rtol,
                "atol": c.atol,
                "exact": c.exact,
                "precision": self.original.data.get("precision"),
                "update_tol": c.update_tol,
                "steps_compared": c.forced + 1,
            }
            if c
            else None,
            "steps": {"original": c.steps[0], "rewrite": c.steps[1]} if c else None,
            "losses": dict(c.losses.to_dict(), first_divergent_step=c.first_divergent_step()) if c else None,
            "params": c.params.to_dict() if c else None,
            "optimizer_state": c.state.to_dict() if c else None,
            "runs": {r.label: _run_dict(r) for r in (self.original, self.rewrite) if r is not None},
            "speedup": self.speedup,
            "verdict": self.verdict,
            "time_verdict": self.time_verdict,
            "workdir": self.workdir,
        }
        return doc


def _run_dict(run) -> dict:
    d = run.data
    return {
        "ok": run.ok,
        "returncode": run.returncode,
        "timed_out": run.timed_out,
        "steps": run.steps,
        "ended": d.get("ended"),
        "ms_per_step": run.step_ms,
        "setup_s": run.setup_s,
        "peak_memory_bytes": d.get("peak_memory"),
        "graphs_captured": d.get("graphs"),
        "profile": d.get("profile"),
        "time_split": d.get("time_split"),
        "values": d.get("values"),
    }


def speed_verdict(report: VerifyReport) -> str:
    """The rule of thumb: CUDA graphs pay off when launch overhead is a large share of the step and
    shapes are stable. Launch overhead shows best as the time the GPU sits idle waiting for the host
    (the launch calls themselves are only part of the host's time per kernel)."""
    original, rewrite = report.original, report.rewrite
    if not report.on_cuda:
        return "no CUDA: both versions ran the same eager code on the CPU, so no speedup can be measured here; run on a GPU"
    fallbacks = rewrite.data.get("fallbacks") or []
    if fallbacks:  # the runtime left the step (or the model, in a partial rewrite) eager on purpose: say why
        subject, _, why = fallbacks[0].split("graphify: ", 1)[-1].partition(" runs eagerly: ")
        return f"the runtime ran {subject} eagerly ({why[:240]}), so it cannot be faster where it did"
    if not rewrite.data.get("graphs"):
        return "the rewrite captured no CUDA graph: every step ran eagerly, so it cannot be faster"
    speedup = report.speedup
    measured = f" (measured {speedup:.2f}x)" if speedup else ""
    replays = (rewrite.data.get("profile") or {}).get("graph_launches_per_step")
    profile = original.data.get("profile") or {}
    busy = profile.get("gpu_busy_share")
    if replays is not None and replays < 0.99:
        return f"shapes are not stable: only {replays:.2f} graph replays per step, the other steps ran eagerly; graphs cannot pay off while shapes change{measured}"
    if busy is None:
        if speedup is None:
            return f"no timing: the loop ran too few steps past warmup and capture (at least {SETUP_STEPS + 2} are needed)"
        return (
            ("CUDA graphs pay off here" if speedup >= 1.1 else "CUDA graphs gain little here")
            + measured
            + "; no profile of launch overhead"
        )
    # the GPU idles while the host launches kernels and runs Python between them: that is what a replay removes
    if busy <= 0.5:
        return f"host-bound: the GPU ran kernels only {busy:.0%} of the eager step and waited on kernel launches and Python the rest, so CUDA graphs pay off{measured}"
    if busy >= 0.9:
        return f"GPU-bound: the GPU ran kernels {busy:.0%} of the eager step, so CUDA graphs gain little{measured}"
    return f"the GPU ran kernels {busy:.0%} of the eager step: expect a moderate gain from CUDA graphs{measured}"
