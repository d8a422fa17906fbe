#!/usr/bin/env python
"""Never slower than eager, for every rewrite form: eager and graphify's rewrite side by side in one run.

Each form is a small user-style script in this folder, rewritten by graphify as users get it:

* whole_step.py: a small MLP trained with Adam, the whole step captured (CapturedStep);
* nan_guard_model.py: a NaN guard reads the loss every step, so only the model is graphed (GraphedModule);
* eval_loop.py: an evaluation loop rewritten whole (an inference step, CapturedStep under no_grad).

One process per form runs its versions in turns (eager, rewrite, rewrite with GRAPHIFY_CAPTURE=always, and
again), `--repeats` times, each run a fresh execution of the script (runpy: new objects, new step functions,
new graphs; the CUDA context and the imports are shared, so start-up is paid once). Each prints its whole loop's time (warmup, capture and the runtime's trial
included) and the time per step over the second half, timed by loop_timer.py in this folder. The ratio is eager's time over the rewrite's (median
of the repeats; above 1 is faster); the forced rewrite keeps its graphs whatever the runtime measures, and
shows what capture alone does. The runtime's decisions (its "runs eagerly" warnings) are printed beside.
A rewrite whose whole loop is slower than eager beyond eager's own spread between repeats fails the run.

Usage (GPU): python bench/never_slower/run.py [--repeats 3] [--steps 600] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

FORMS = {
    "whole_step": ("whole step (CapturedStep)", "CapturedStep("),
    "nan_guard_model": ("model beside a NaN guard (GraphedModule)", "GraphedModule("),
    "eval_loop": ("evaluation loop rewritten whole", "CapturedStep("),
}
VERSIONS = ("eager", "rewrite", "forced")
NOISE_FLOOR = 0.03  # ratios within 3% of 1 are noise, whatever the spread


def rewrite(form: str, folder: Path) -> None:
    from graphify.rewrite import rewrite_source

    source = (HERE / f"{form}.py").read_text()
    result = rewrite_source(source, f"{form}.py")
    assert result.changed and not result.errors, [o.reasons for o in result.outcomes]
    assert FORMS[form][1] in result.code, f"{form}: not rewritten as {FORMS[form][0]}"
    (folder / f"{form}-eager.py").write_text(source)
    (folder / f"{form}-rewrite.py").write_text(result.code)


def run_once(script: Path, version: str, steps: int) -> dict:
    """One run of a script in this process, as `python SCRIPT --steps N` would run it."""
    import contextlib
    import io
    import runpy
    import warnings

    os.environ.pop("GRAPHIFY_CAPTURE", None)
    if version == "forced":
        os.environ["GRAPHIFY_CAPTURE"] = "always"
    argv, sys.argv = sys.argv, [str(script), "--steps", str(steps)]
    out = io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
            warnings.simplefilter("always")
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
        os.environ.pop("GRAPHIFY_CAPTURE", None)
    text = out.getvalue()
    match = re.search(r"loop s ([0-9.]+) steady ms/step ([0-9.]+)", text)
    decisions = sorted({str(w.message) for w in caught if type(w.message).__name__ == "GraphifyFallbackWarning"})
    return {"loop_s": float(match.group(1)), "steady_ms": float(match.group(2)), "decisions": decisions, "result": text.splitlines()[0]}


def worker(form: str, folder: Path, steps: int, repeats: int) -> None:
    """The runs of one form, versions in turns: one JSON line of results."""
    scripts = {v: folder / f"{form}-{'eager' if v == 'eager' else 'rewrite'}.py" for v in VERSIONS}
    runs = {v: [] for v in VERSIONS}
    run_once(scripts["eager"], "eager", steps)  # untimed: one-time costs (lazy loading, the allocator's first blocks) paid by no version
    for _ in range(repeats):
        for version in VERSIONS:
            runs[version].append(run_once(scripts[version], version, steps))
    print("RESULT " + json.dumps(runs))


def run_form(form: str, folder: Path, steps: int, repeats: int) -> dict:
    # the scripts import loop_timer from this folder, wherever their rewritten copies are written
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]))
    env.pop("GRAPHIFY_CAPTURE", None)
    command = [sys.executable, __file__, "--worker", form, "--folder", str(folder), "--steps", str(steps), "--repeats", str(repeats)]
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if run.returncode != 0 or not lines:
        raise SystemExit(f"{form} failed:\n{run.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def summarize(runs: dict) -> dict:
    eager_loop = [r["loop_s"] for r in runs["eager"]]
    spread = (max(eager_loop) - min(eager_loop)) / statistics.median(eager_loop)
    out = {"eager_spread": spread}
    for version in ("rewrite", "forced"):
        loop = statistics.median(eager_loop) / statistics.median(r["loop_s"] for r in runs[version])
        steady = statistics.median(r["steady_ms"] for r in runs["eager"]) / statistics.median(r["steady_ms"] for r in runs[version])
        out[version] = {"loop_ratio": loop, "steady_ratio": steady, "decisions": sorted({d for r in runs[version] for d in r["decisions"]})}
    out["never_slower"] = out["rewrite"]["loop_ratio"] >= 1 - max(NOISE_FLOOR, spread)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--out", type=Path, default=None, help="folder for never_slower.json")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.folder, args.steps, args.repeats)
        return 0
    import torch

    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU (no timing meaning)'}; {args.repeats} repeats of {args.steps} steps, versions in turns"
    )
    report, failed = {}, False
    with tempfile.TemporaryDirectory() as tmp:
        for form in args.forms.split(","):
            rewrite(form, Path(tmp))
            runs = run_form(form, Path(tmp), args.steps, args.repeats)
            summary = summarize(runs)
            report[form] = {"runs": runs, **summary}
            failed |= not summary["never_slower"]
            eager_ms = statistics.median(r["steady_ms"] for r in runs["eager"])
            eager_s = statistics.median(r["loop_s"] for r in runs["eager"])
            print(
                f"\n{form}: {FORMS[form][0]}; eager {eager_s:.3f} s a loop, {eager_ms:.3f} ms/step (spread between repeats {summary['eager_spread']:.1%})"
            )
            for version in ("rewrite", "forced"):
                s = summary[version]
                label = "rewrite" if version == "rewrite" else "rewrite, graphs kept (GRAPHIFY_CAPTURE=always)"
                print(f"  {label}: whole loop {s['loop_ratio']:.2f}x of eager, steady steps {s['steady_ratio']:.2f}x")
                for decision in s["decisions"]:
                    print(f"    runtime: {decision[:300]}")
            print(f"  never slower: {'yes' if summary['never_slower'] else 'NO'}")
            print(f"  results: eager {runs['eager'][0]['result']} | rewrite {runs['rewrite'][0]['result']}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "never_slower.json").write_text(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
