"""`graphify verify`: run a script and its rewrite side by side and check they train the same.

    instrument (a probe after the step) -> rewrite the instrumented source -> run both (runner, child)
    -> compare losses, final parameters and optimizer state -> report (table or JSON)

Importing this package is cheap (the CLI imports it); the work imports torch, libcst and rich lazily.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable, Sequence

from graphify.verify.report import ERROR, FAILED, PASSED, VerifyReport

__all__ = ["VerifyReport", "verify_file"]


DEFAULT_STEPS = 50
REENTRY_MAX_STEPS = 300  # by default, a loop that may be entered again runs up to this long to see it happen


def verify_file(
    path: str,
    steps: int | None = None,
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
    rewritten: str | None = None,
    time_split: bool = True,
) -> VerifyReport:
    """Verify `graphify rewrite` of the script at `path` over its first `steps` steps; with `rewritten`
    (a path), verify that file instead, a rewrite edited by hand or made by an older graphify.
    steps=None: 50, or for a loop that may be entered again (a `train()` called per epoch) until it was
    entered a second time and ran 10 steps there, up to 300.

    rtol/atol: None for the defaults (exact on the CPU; on CUDA by precision, see compare.CUDA_TOLERANCES). `progress`: an object with
    `stage(text)` and `step(label, done, total)` (see display.Progress). `rewrite_hook` changes the
    rewritten source before it runs (tests use it to plant wrong rewrites). `time_split`: split each
    run's time into start-up, data wait, copies, step, host reads, evaluation and the rest (timing.py).
    Never raises for a bad script: the report's exit_code and message say what happened.
    """
    from graphify.files import SourceError, read_source
    from graphify.verify.instrument import InstrumentError, instrument, instrument_given

    report = VerifyReport(path, steps or DEFAULT_STEPS, list(args))
    progress = progress or _Silent()
    try:
        reading = path
        source = read_source(path)
        reading = rewritten
        given = read_source(rewritten) if rewritten is not None else None
        progress.stage("instrumenting and rewriting" if given is None else "instrumenting both versions")
        inst = instrument(source, path, settings) if given is None else instrument_given(source, path, given, settings)
    except SourceError as exc:
        return _end(report, ERROR, f"cannot read {reading}: {exc.message}")
    except InstrumentError as exc:
        return _end(report, ERROR, str(exc))
    report.loop = {"line": inst.line, "kind": inst.kind, "function": inst.function}
    report.loop.update(step_function=inst.step_name, records_values=inst.records_values)
    original, rewritten = _versions(inst, rewrite_hook, time_split)
    workdir = tempfile.mkdtemp(prefix="graphify-verify-")
    until_reentry = REENTRY_MAX_STEPS if steps is None and inst.reenterable else None
    options = {"profile": profile, "timeout": timeout, "until_reentry": until_reentry, "time_split": time_split}
    try:
        _run(report, original, rewritten, workdir, progress, rtol, atol, options)
        _warn_uncovered(report, inst)
        return report
    finally:
        if keep:
            report.workdir = workdir
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _versions(inst, rewrite_hook, time_split: bool) -> tuple[str, str]:
    """The code each version runs: the rewrite as the hook leaves it; with the time split, both with its marks."""
    from graphify.verify.instrument import timing_marks

    rewritten = rewrite_hook(inst.rewritten) if rewrite_hook else inst.rewritten
    return timing_marks(inst.original, rewritten, inst.other_loops) if time_split else (inst.original, rewritten)


def _run(report, original_code, rewritten_code, workdir, progress, rtol, atol, options: dict) -> VerifyReport:
    from graphify.verify.compare import compare_runs, tolerances
    from graphify.verify.runner import run_version

    states = os.path.join(workdir, "states")  # the original's state after each step: the rewrite starts each step from it
    runs = {}
    for label, code in (("original", original_code), ("rewrite", rewritten_code)):
        progress.stage(f"running the {label}" + (" on the original's trajectory" if label == "rewrite" else ""))
        run = run_version(
            label,
            code,
            report.path,
            report.steps_requested,
            report.args,
            workdir,
            states_out=states if label == "original" else None,
            states_in=states if label == "rewrite" else None,
            on_step=lambda n, label=label: progress.step(label, n, report.steps_requested),
            **options,
        )
        runs[label] = run
        setattr(report, label, run)
        if not run.ok:
            what = "the original script" if label == "original" else "the rewritten script"
            why = f"timed out after {options['timeout']:g} s" if run.timed_out else f"failed (exit status {run.returncode})"
            report.detail = run.stderr_tail + ("" if label == "original" else "\n(--keep keeps the rewritten script to inspect)")
            return _end(report, ERROR if label == "original" else FAILED, f"{what} {why}")
        if label == "original" and run.steps == 0:
            return _end(report, ERROR, f"the original script ended before its first step of the loop at line {report.loop['line']}")
    original = runs["original"]
    on_cuda, precision = original.data.get("on_cuda", False), original.data.get("precision", "float32")
    rtol, atol, update_tol = tolerances(on_cuda, precision, rtol, atol)
    report.comparison = c = compare_runs(original, runs["rewrite"], rtol, atol, update_tol)
    if c.equivalent:
        how = (
            " (exact)"
            if c.exact
            else f" ({precision}: losses within rtol {rtol:g}, atol {atol:g}; state within {update_tol:g} of each step's update)"
        )
        return _end(report, PASSED, f"the rewrite is equivalent: {c.forced + 1} steps compared from identical state" + how)
    noise = _original_against_itself(report, original_code, workdir, progress, (rtol, atol, update_tol), options)
    if noise is not None and _within_noise(c, noise):
        report.warnings.append(_noise_words(c, noise))
        return _end(
            report,
            PASSED,
            f"the rewrite is equivalent within the original's own run-to-run differences: {c.forced + 1} steps compared from identical state",
        )
    if noise is not None:
        report.warnings.append(_noise_words(c, noise))
    return _end(report, FAILED, "the rewrite is NOT equivalent: " + "; ".join(_differences(c)))


# How far beyond two runs of the original a rewrite may land and still be the same training: their differences
# come from operations whose order changes from run to run (atomic adds), which a rewrite reorders as freely.
NOISE_FACTOR = 4.0


def _original_against_itself(report, original_code, workdir, progress, tols, options):
    """The original run once more, forced onto its own states like the rewrite: what its steps differ by from
    run to run (nondeterministic kernels). None when it does not run to the end or matches itself exactly:
    then every difference of the rewrite is the rewrite's."""
    from graphify.verify.compare import compare_runs
    from graphify.verify.runner import run_version

    progress.stage("running the original again on its own trajectory, to measure its run-to-run differences")
    states = os.path.join(workdir, "states")
    again = run_version(
        "original-again",
        original_code,
        report.path,
        report.steps_requested,
        report.args,
        workdir,
        states_in=states,
        timeout=options["timeout"],
        until_reentry=options["until_reentry"],
    )
    if not again.ok or again.steps != report.original.steps:
        return None
    noise = compare_runs(report.original, again, *tols)
    parts = (noise.losses, noise.params, noise.state)
    return None if noise.forced != report.comparison.forced or all(d.max_rel == 0 for d in parts) else noise


def _within_noise(c, noise) -> bool:
    """Each part of the rewrite's comparison (losses, parameters, optimizer state) within NOISE_FACTOR times
    what two runs of the original differ by, step counts and shapes alike."""
    if c.steps[0] != c.steps[1] or any(d.problems for d in (c.losses, c.params, c.state)):
        return False
    pairs = ((c.losses, noise.losses), (c.params, noise.params), (c.state, noise.state))
    return all(d.ok or d.max_rel <= NOISE_FACTOR * n.max_rel for d, n in pairs)


def _noise_words(c, noise) -> str:
    part = max(
        ((n.max_rel, name) for name, n in (("losses", noise.losses), ("parameters", noise.params), ("optimizer state", noise.state)))
    )
    return (
        f"two runs of the original differ too (something in its steps changes from run to run: kernels that add in "
        f"any order, such as atomic scatter-adds, or unseeded data): "
        f"{part[1]} by up to {part[0]:.2g} (relative), the rewrite by up to {max(c.losses.max_rel, c.params.max_rel, c.state.max_rel):.2g}"
    )


def _warn_uncovered(report, inst) -> None:
    """Say what the run did not reach: a second entry of the loop, a change of the learning rate."""
    run = report.original
    if run is None or not run.ok:
        return
    stopped = run.data.get("ended") == "steps"
    if inst.reenterable and stopped and len(run.data.get("entries", [])) < 2:
        report.warnings.append(
            f"the run stopped after {run.steps} steps, before the loop was entered a second time "
            "(a second epoch): the reuse of its graphs was not compared; run more steps"
        )
    lrs = run.data.get("lrs", [])
    if inst.scheduled and lrs and all(v == lrs[0] for v in lrs) and stopped:
        report.warnings.append(
            f"the learning rate did not change within the {run.steps} compared steps: the schedule was not checked; run more steps"
        )


def _differences(c) -> list[str]:
    out = []
    if c.steps[0] != c.steps[1]:
        out.append(f"the original ran {c.steps[0]} steps, the rewrite {c.steps[1]}")
    if c.losses.first_bad or c.losses.problems:
        out.append(f"losses differ from {c.losses.first_bad}" if c.losses.first_bad else c.losses.problems[0])
    for what, d in (("parameters differ", c.params), ("optimizer state or buffers differ", c.state)):
        if d.first_bad or d.problems:
            out.append(f"{what} at {d.first_bad or d.problems[0]} ({d.max_rel:.2g} of the step's update)")
    return out


def _end(report: VerifyReport, code: int, message: str) -> VerifyReport:
    report.exit_code, report.message = code, message
    return report


class _Silent:
    def stage(self, text: str) -> None:
        pass

    def step(self, label: str, done: int, total: int) -> None:
        pass
