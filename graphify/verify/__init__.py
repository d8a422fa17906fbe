"""`graphify verify`: run a script and its rewrite side by side and check they train the same.

    instrument (a probe after the step) -> rewrite the instrumented source -> run both (runner, child)
    -> compare losses, final parameters and optimizer state -> report (table or JSON)

Importing this package is cheap (the CLI imports it); the work imports torch, libcst and rich lazily.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Callable, Sequence

from graphify.verify.report import ERROR, FAILED, PASSED, VerifyReport

__all__ = ["VerifyReport", "verify_file"]


def verify_file(
    path: str,
    steps: int = 50,
    args: Sequence[str] = (),
    rtol: float | None = None,
    atol: float | None = None,
    *,
    settings=None,
    profile: bool = True,
    timeout: float | None = None,
    keep: bool = False,
    progress=None,
    rewrite_hook: Callable[[str], str] | None = None,
) -> VerifyReport:
    """Verify `graphify rewrite` of the script at `path` over its first `steps` steps.

    rtol/atol: None for the defaults (exact on the CPU; on CUDA by precision, see compare.CUDA_TOLERANCES,
    with a noise run when those are exceeded). `progress`: an object with
    `stage(text)` and `step(label, done, total)` (see display.Progress). `rewrite_hook` changes the
    rewritten source before it runs (tests use it to plant wrong rewrites). Never raises for a bad
    script: the report's exit_code and message say what happened.
    """
    from graphify.files import SourceError, read_source
    from graphify.verify.instrument import InstrumentError, instrument

    report = VerifyReport(path, steps, list(args))
    progress = progress or _Silent()
    try:
        source = read_source(path)
        progress.stage("instrumenting and rewriting")
        inst = instrument(source, path, settings)
    except SourceError as exc:
        return _end(report, ERROR, f"cannot read {path}: {exc.message}")
    except InstrumentError as exc:
        return _end(report, ERROR, str(exc))
    report.loop = {"line": inst.line, "kind": inst.kind, "function": inst.function, "step_function": inst.step_name,
                   "records_values": inst.records_values}
    rewritten = rewrite_hook(inst.rewritten) if rewrite_hook else inst.rewritten
    workdir = tempfile.mkdtemp(prefix="graphify-verify-")
    try:
        return _run(report, inst.original, rewritten, workdir, profile, timeout, progress, rtol, atol)
    finally:
        if keep:
            report.workdir = workdir
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(report, original_code, rewritten_code, workdir, profile, timeout, progress, rtol, atol) -> VerifyReport:
    from graphify.verify.compare import NOISE_FACTOR, compare_runs, tolerances
    from graphify.verify.runner import run_version

    runs = {}
    for label, code in (("original", original_code), ("rewrite", rewritten_code)):
        progress.stage(f"running the {label}")
        run = run_version(label, code, report.path, report.steps_requested, report.args, workdir, profile=profile,
                          timeout=timeout, on_step=lambda n, label=label: progress.step(label, n, report.steps_requested))
        runs[label] = run
        setattr(report, label, run)
        if not run.ok:
            what = "the original script" if label == "original" else "the rewritten script"
            why = f"timed out after {timeout:g} s" if run.timed_out else f"failed (exit status {run.returncode})"
            report.detail = run.stderr_tail + ("" if label == "original" else "\n(--keep keeps the rewritten script to inspect)")
            return _end(report, ERROR if label == "original" else FAILED, f"{what} {why}")
        if label == "original" and run.steps == 0:
            return _end(report, ERROR, f"the original script ended before its first step of the loop at line {report.loop['line']}")
    original = runs["original"]
    on_cuda, precision = original.data.get("on_cuda", False), original.data.get("precision", "float32")
    defaults = rtol is None and atol is None
    rtol, atol = tolerances(on_cuda, precision, rtol, atol)
    report.comparison = c = compare_runs(original, runs["rewrite"], rtol, atol)
    if not c.equivalent and on_cuda and defaults and c.steps[0] == c.steps[1]:
        noise = _noise_run(report, original_code, workdir, timeout, progress)
        if noise is not None:
            report.comparison = c = compare_runs(original, runs["rewrite"], rtol, atol, compare_runs(original, noise, 0.0, 0.0))
    if c.equivalent:
        how = "" if c.exact else f" ({precision}: rtol {rtol:g}, atol {atol:g}" + (
            f", plus {NOISE_FACTOR}x the rounding noise of the original)" if c.noise else ")")
        return _end(report, PASSED, "the rewrite is equivalent" + how)
    return _end(report, FAILED, "the rewrite is NOT equivalent: " + "; ".join(_differences(c)))


def _noise_run(report, original_code, workdir, timeout, progress):
    """The original once more, its parameters nudged by one ulp after step 1: how far rounding alone
    carries this training. Training amplifies rounding, most of all in parameters whose gradients are
    pure rounding noise (an attention key bias), so a replay that rounds differently from eager can
    exceed a fixed tolerance there; it must not exceed what rounding does to the original itself."""
    from graphify.verify.runner import run_version

    progress.stage("measuring rounding noise (the original again, nudged by one ulp)")
    run = run_version("noise", original_code, report.path, report.steps_requested, report.args, workdir, nudge=True,
                      timeout=timeout, on_step=lambda n: progress.step("noise", n, report.steps_requested))
    if not run.ok or run.steps != report.original.steps:
        return None
    report.noise = run
    return run


def _differences(c) -> list[str]:
    out = []
    if c.steps[0] != c.steps[1]:
        out.append(f"the original ran {c.steps[0]} steps, the rewrite {c.steps[1]}")
    if c.losses.first_bad or c.losses.problems:
        out.append(f"losses differ from {c.losses.first_bad}" if c.losses.first_bad else c.losses.problems[0])
    for what, d in (("parameters differ", c.params), ("optimizer state differs", c.state)):
        if d.first_bad or d.problems:
            out.append(f"{what} ({d.first_bad or d.problems[0]})")
    return out


def _end(report: VerifyReport, code: int, message: str) -> VerifyReport:
    report.exit_code, report.message = code, message
    return report


class _Silent:
    def stage(self, text: str) -> None:
        pass

    def step(self, label: str, done: int, total: int) -> None:
        pass
