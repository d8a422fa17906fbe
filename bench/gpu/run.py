#!/usr/bin/env python
"""GPU benchmark: eager vs graphify vs hand-written capture vs torch.compile(reduce-overhead).

For every workload in bench/workloads/ and every variant, a fresh Python subprocess (clean memory
statistics, empty compile caches) builds the workload and times whole ``train`` calls:

* one untimed-for-speed first call of n1 steps (its setup is the cold setup a user pays once);
* then ``repeats`` times: a call of n1 steps and a call of n2 steps, each on a freshly built
  workload, timed with ``torch.cuda.synchronize()`` + ``time.perf_counter()``.

ms/step = median over repeats of (t(n2) - t(n1)) / (n2 - n1); setup = t(first call) - n1 * ms/step,
which holds side-stream warmup + capture for the graph variants and compilation for the
torch.compile variants.

This file is the driver; each run's worker (building and timing one variant) is bench/gpu/worker.py.

Usage (GPU, whole benchmark, about 8 minutes on one H100; no new run starts after --budget-s):

    python bench/gpu/run.py [--copy-to "$OUT"]

The graphify variant rewrites the workload with ``graphify.rewrite.rewrite_source`` in the worker.
On a machine where that cannot be imported (e.g. libcst missing), run

    python bench/gpu/run.py --rewrite-only

where it can; the rewrites land in bench/results/graphified/ (with source hashes) and are used
while they match the workload sources.

CPU smoke test (eager only, a few steps, no docs written):

    python bench/gpu/run.py --quick --workloads tiny,mlp

graphify against hand capture on the launch-bound workloads, in alternating rounds (each round runs every
variant once, in turn, so that a slow spell of the machine falls on both; each (workload, variant) then
reports the median of all its rounds' repeats, the spread, and each round's median):

    python bench/gpu/run.py --workloads tiny,mlp --variants eager,graphify,hand --rounds 4 --repeats 5 --no-docs

Re-render docs from an existing results file:

    python bench/gpu/run.py --render-only bench/results/gpu.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.gpu.worker import (  # noqa: E402
    COMPILE_VARIANTS,
    Unavailable,
    _load_rewriter,
    ahead_of_time_rewrite,
    rewrite_workload,
    short_reason,
    worker_main,
)
from bench.workloads import (  # noqa: E402
    WORKLOADS,
    workload_path,
)

VARIANTS = ("eager", "graphify", "hand", "compile-model", "compile-step", "compile-default", "graphify-compile")
# The main table; the compile comparison (compile-default, graphify-compile) runs on its own: --variants.
DEFAULT_VARIANTS = VARIANTS[:5]

#: (n1, n2) steps per workload. ms/step is measured over the n2 - n1 extra steps, so n2 - n1 is
#: chosen large enough that even graph replays (30-40 microseconds a step on tiny, where 600 steps
#: proved too short to time against host jitter) add up to far more than the jitter of a call's
#: setup, and small enough that the whole benchmark fits in one 10-minute call on an H200 (the
#: compute-bound workloads take 0.04-0.5 s a step). n1 is past warmup and capture (3 + 1 steps, 5 with
#: graphify's host-value record) and graphify's loop trial after it (24 calls, half of them eager: setup,
#: as the capture is), so that the difference of two calls holds replays only, never a capture or a trial
#: turn; at n1 = 20 it held 5 eager calls of the trial. (The recorded replays at the 128th, 256th, ...
#: replay stay in it: they recur in any run, if ever more rarely.)
STEPS = {
    "tiny": (40, 2040),
    "mlp": (40, 440),
    "cnn": (40, 340),
    "transformer": (40, 240),
    "mlp_large_batch": (5, 11),
    "cnn_large": (5, 15),
}
QUICK_STEPS = (4, 8)
DEFAULT_REPEATS = 3

RESULTS_JSON = REPO / "bench" / "results" / "gpu.json"
QUICK_JSON = Path(tempfile.gettempdir()) / "graphify-bench-quick.json"
GRAPHIFIED_DIR = REPO / "bench" / "results" / "graphified"
DOCS_DIR = REPO / "docs"

VARIANT_DOC = {
    "eager": "the workload's `train()` as written",
    "graphify": "`train()` after `graphify.rewrite.rewrite_source` (the rewritten module is imported from a file)",
    "hand": "the workload's `train_hand()`: whole step (forward, backward, optimizer) captured by hand in one CUDA graph",
    "compile-model": '`train()` given `torch.compile(model, mode="reduce-overhead")`',
    "compile-step": '`torch.compile(step, mode="reduce-overhead")` of forward + backward + `optimizer.step()` '
    "(tensor LR when there is a scheduler, as in PyTorch's compiled-optimizer recipe)",
    "compile-default": "`train()` given `torch.compile(model)` (default mode: fused kernels, no CUDA graphs)",
    "graphify-compile": "the graphify rewrite of `train()` given `torch.compile(model)`: the whole step (compiled forward "
    "and backward, optimizer) captured after compile's own warmup",
}


# --------------------------------------------------------------------------------------------
# driver side
# --------------------------------------------------------------------------------------------


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_variant(workload, variant, n1, n2, args, timeout_s) -> dict:
    """Run one (workload, variant) in a fresh subprocess with empty compile caches."""
    with tempfile.TemporaryDirectory(prefix="graphify-bench-") as tmp:
        result_file = Path(tmp) / "result.json"
        env = dict(os.environ)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor")
        env["TRITON_CACHE_DIR"] = str(Path(tmp) / "triton")
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker-workload",
            workload,
            "--worker-variant",
            variant,
            "--worker-n1",
            str(n1),
            "--worker-n2",
            str(n2),
            "--repeats",
            str(args.repeats),
            "--result-file",
            str(result_file),
            "--graphified-dir",
            str(args.graphified_dir),
        ]
        if args.cpu:
            cmd.append("--cpu")
        if args.compile_reset:
            cmd.append("--compile-reset")
        log_path = Path(tmp) / "log.txt"
        start = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait()
                rc = None
            else:
                _kill_group(proc)  # stray compile workers of the finished worker, if any
        wall = time.perf_counter() - start
        log_tail = log_path.read_text(errors="replace")[-4000:]
        if rc is None:
            result = {"status": "failed", "reason": f"timeout after {timeout_s:.0f} s"}
        elif result_file.exists():
            result = json.loads(result_file.read_text())
        else:
            last = [line for line in log_tail.splitlines() if line.strip()]
            result = {
                "status": "failed",
                "reason": f"worker exited with {rc}: {last[-1][:150] if last else 'no output'}",
            }
        result.update(workload=workload, variant=variant, wall_s=wall)
        if result.get("status") == "failed":
            result["log_tail"] = log_tail[-1500:]
        return result


def describe(result: dict) -> str:
    status = result.get("status")
    if status == "ok":
        return f"{result['ms_per_step']:.3f} ms/step, setup {result['setup_s']:.2f} s"
    return f"{status}: {result.get('reason', '')}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated; known: {', '.join(VARIANTS)}")
    p.add_argument("--quick", action="store_true", help="tiny step counts; on CPU only eager runs")
    p.add_argument("--repeats", type=int, default=None, help=f"timing repeats (default {DEFAULT_REPEATS}, quick 1)")
    p.add_argument("--rounds", type=int, default=1, help="run the whole plan this many times, in turn (alternating rounds)")
    p.add_argument("--cpu", action="store_true", help="force CPU even when CUDA is available")
    p.add_argument("--json", default=None, help=f"results file (default {RESULTS_JSON.relative_to(REPO)}; --quick: {QUICK_JSON})")
    p.add_argument("--docs-dir", default=None, help="where benchmarks.md/.png go (default docs/; not in --quick)")
    p.add_argument("--no-docs", action="store_true")
    p.add_argument("--graphified-dir", default=str(GRAPHIFIED_DIR), help="where rewritten workloads are saved")
    p.add_argument("--budget-s", type=float, default=480.0, help="stop starting new runs after this long")
    p.add_argument("--timeout-s", type=float, default=120.0, help="per-run limit, non-compile variants")
    p.add_argument("--compile-timeout-s", type=float, default=150.0, help="per-run limit, compile variants")
    p.add_argument(
        "--compile-reset",
        action="store_true",
        help="torch._dynamo.reset() before every build (timed calls then recompile with warm caches)",
    )
    p.add_argument(
        "--rewrite-only",
        action="store_true",
        help="only rewrite the workloads with graphify into --graphified-dir (for machines without libcst)",
    )
    p.add_argument("--copy-to", default=None, help="also copy the outputs into this directory")
    p.add_argument("--render-only", metavar="JSON", default=None, help="only render docs from a results file")
    # worker mode (internal)
    p.add_argument("--worker-workload", help=argparse.SUPPRESS)
    p.add_argument("--worker-variant", help=argparse.SUPPRESS)
    p.add_argument("--worker-n1", type=int, help=argparse.SUPPRESS)
    p.add_argument("--worker-n2", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else DEFAULT_REPEATS

    if args.worker_workload:
        return worker_main(args)

    from bench.gpu.report import render_markdown, render_plot

    if args.render_only:
        data = json.loads(Path(args.render_only).read_text())
        docs_dir = Path(args.docs_dir) if args.docs_dir else DOCS_DIR
        _write_docs(data, docs_dir, render_markdown, render_plot)
        return 0

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if args.rewrite_only:
        rewrite_source = _load_rewriter()
        for w in workloads:
            out_path, notes = rewrite_workload(w, rewrite_source, Path(args.graphified_dir))
            print(f"{w}: wrote {out_path}" + (f" ({'; '.join(notes)})" if notes else ""))
        return 0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}; known: {', '.join(WORKLOADS)}")
    for v in variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    if "eager" not in variants:
        variants.insert(0, "eager")  # speedups are relative to eager

    import torch  # only to learn whether CUDA exists; CUDA is not initialised here

    has_cuda = torch.cuda.is_available() and not args.cpu
    if not has_cuda:
        args.cpu = True
    json_path = Path(args.json) if args.json else (QUICK_JSON if args.quick else RESULTS_JSON)
    write_docs = not args.no_docs and (args.docs_dir is not None or not args.quick)
    docs_dir = Path(args.docs_dir) if args.docs_dir else DOCS_DIR

    # cheap variants first, compile variants last (small workloads first): if the time budget runs
    # out, only compile variants of the last workloads are cut
    plan = [(w, v) for w in workloads for v in variants if v not in COMPILE_VARIANTS]
    plan += [(w, v) for w in workloads for v in variants if v in COMPILE_VARIANTS]

    t_start = time.perf_counter()
    runs: dict[tuple[str, str], list[dict]] = {}
    for round_index in range(args.rounds):
        for workload, variant in plan:
            res = _planned_run(workload, variant, args, has_cuda, args.budget_s - (time.perf_counter() - t_start))
            runs.setdefault((workload, variant), []).append(res)
            label = f" round {round_index + 1}" if args.rounds > 1 else ""
            print(f"[{time.perf_counter() - t_start:6.1f}s]{label} {workload:16s} {variant:14s} {describe(res)}", flush=True)
    results: dict[str, dict[str, dict]] = {w: {} for w in workloads}
    for (workload, variant), rounds in runs.items():
        results[workload][variant] = merge_rounds(rounds)
    env_info = next((r["env"] for rounds in runs.values() for r in rounds if r.get("env")), None)
    if args.rounds > 1:
        for line in rounds_summary(results, workloads):
            print(line)

    total = time.perf_counter() - t_start
    data = {
        "meta": {
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "env": env_info or {"torch": torch.__version__, "python": platform.python_version(), "device": "?"},
            "quick": args.quick,
            "repeats": args.repeats,
            "rounds": args.rounds,
            "compile_reset": args.compile_reset,
            "steps": {w: list(QUICK_STEPS if args.quick else STEPS[w]) for w in workloads},
            "total_wall_s": total,
            "variants": {v: VARIANT_DOC[v] for v in variants},
            "workload_docs": {w: _first_doc_line(w) for w in workloads},
            "git_commit": _git_commit(),
        },
        "results": results,
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {json_path} ({total:.0f} s)")
    outputs = [json_path]
    if write_docs:
        outputs += _write_docs(data, docs_dir, render_markdown, render_plot)
    if args.copy_to:
        dest = Path(args.copy_to)
        dest.mkdir(parents=True, exist_ok=True)
        for path in outputs:
            if path.resolve() != (dest / path.name).resolve():
                shutil.copy2(path, dest / path.name)
        gdir = Path(args.graphified_dir)
        if gdir.is_dir() and any(gdir.iterdir()):
            shutil.copytree(gdir, dest / "graphified", dirs_exist_ok=True)
        print(f"copied outputs to {dest}")
    failed_eager = [w for w in workloads if results[w]["eager"].get("status") != "ok"]
    if failed_eager:
        print(f"eager failed for: {', '.join(failed_eager)}", file=sys.stderr)
        return 1
    return 0


def _planned_run(workload: str, variant: str, args, has_cuda: bool, left: float) -> dict:
    """One (workload, variant) run, or why it is skipped; `left`: seconds of the time budget left."""
    n1, n2 = QUICK_STEPS if args.quick else STEPS[workload]
    if not has_cuda and variant != "eager":
        res = {"status": "skipped", "reason": "needs CUDA (CPU run checks eager only)"}
    elif variant == "graphify" and (reason := _graphify_unavailable(workload, args)):
        res = {"status": "unavailable", "reason": reason}
    elif left < 20:
        res = {"status": "skipped", "reason": f"time budget ({args.budget_s:.0f} s) used up"}
    else:
        limit = args.compile_timeout_s if variant in COMPILE_VARIANTS else args.timeout_s
        res = run_variant(workload, variant, n1, n2, args, min(limit, left))
        if left < limit and "timeout" in str(res.get("reason", "")):
            res["reason"] += " (cut by the overall time budget)"
    res.setdefault("workload", workload)
    res.setdefault("variant", variant)
    return res


def merge_rounds(rounds: list[dict]) -> dict:
    """One result from a (workload, variant)'s runs in alternating rounds: the first run that measured, its
    ms/step the median of every round's repeats, with each round's median (`round_ms_per_step`, None where
    that round did not measure)."""
    measured = [r for r in rounds if r.get("status") == "ok"]
    if len(rounds) == 1 or not measured:
        return rounds[0]
    merged = dict(measured[0])
    merged["ms_per_step_repeats"] = [ms for r in measured for ms in r["ms_per_step_repeats"]]
    merged["ms_per_step"] = statistics.median(merged["ms_per_step_repeats"])
    merged["round_ms_per_step"] = [r["ms_per_step"] if r.get("status") == "ok" else None for r in rounds]
    if len(measured) < len(rounds):
        merged["notes"] = [*merged.get("notes", []), f"{len(rounds) - len(measured)} of {len(rounds)} rounds did not measure"]
    return merged


def rounds_summary(results: dict, workloads: list[str]) -> list[str]:
    """Per workload, each variant's median ms/step over its rounds' repeats with their spread, and graphify's
    share of hand capture's speedup (hand ms / graphify ms), overall and round by round."""
    lines = []
    for w in workloads:
        shown = []
        for variant, res in results[w].items():
            if res.get("status") == "ok":
                repeats = res["ms_per_step_repeats"]
                shown.append(f"{variant} {res['ms_per_step']:.4f} ms ({min(repeats):.4f}-{max(repeats):.4f}, {len(repeats)} repeats)")
        lines.append(f"{w}: " + "; ".join(shown))
        graphify, hand = results[w].get("graphify", {}), results[w].get("hand", {})
        if graphify.get("status") == hand.get("status") == "ok":
            by_round = zip(graphify.get("round_ms_per_step", []), hand.get("round_ms_per_step", []))
            rounds = ", ".join(f"{h / g:.0%}" if g and h else "-" for g, h in by_round)
            lines.append(f"{w}: graphify / hand speedup {hand['ms_per_step'] / graphify['ms_per_step']:.0%} (round by round: {rounds})")
    return lines


def _graphify_unavailable(workload: str, args) -> str | None:
    """Why the graphify variant cannot run (checked here to spare a subprocess), or None."""
    try:
        _load_rewriter()
    except Unavailable as missing:
        out_path, problem = ahead_of_time_rewrite(workload, Path(args.graphified_dir))
        if out_path is None:
            return f"{missing}; {problem}"
    return None


KEPT_MARKER = "<!-- real-world suite: kept when the GPU benchmark rewrites this file -->"


def _write_docs(data, docs_dir: Path, render_markdown, render_plot) -> list[Path]:
    docs_dir.mkdir(parents=True, exist_ok=True)
    md_path = docs_dir / "benchmarks.md"
    png_path = docs_dir / "benchmarks.png"
    written = []
    try:
        made_png = render_plot(data, png_path)
    except Exception as exc:  # a missing matplotlib must not lose the table
        print(f"plot not written: {short_reason(exc)}", file=sys.stderr)
        made_png = False
    if made_png:
        written.append(png_path)
    kept = ""  # the real-world suite's sections, written by bench/real/, survive a new benchmark run
    if md_path.exists() and KEPT_MARKER in md_path.read_text():
        kept = "\n" + KEPT_MARKER + md_path.read_text().split(KEPT_MARKER, 1)[1]
    md_path.write_text(render_markdown(data, png_name=png_path.name if made_png else None) + kept)
    written.insert(0, md_path)
    for path in written:
        print(f"wrote {path}")
    return written


def _first_doc_line(workload: str) -> str:
    try:
        import ast

        doc = ast.get_docstring(ast.parse(workload_path(workload).read_text())) or ""
        return " ".join(doc.split())
    except Exception:
        return ""


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
