"""Run the real-world suite: rewrite each script, verify the rewrite on the GPU, time both.

    python bench/real/run.py prepare [--mirrors DIR]     # here: lay out scripts and support files
    python bench/real/run.py run [--only ID ...] [--json FILE] [--repeat N]   # GPU machine: data, verify, timing
                                                  # (--only replaces those records of FILE, keeps the rest)
    python bench/real/run.py report --json FILE [--out FILE]     # the table (bench/results/real_run.md)
    python bench/real/run.py long [--only ID ...] [--json FILE] [--repeat N]  # GPU machine: whole runs at length
    python bench/real/run.py long-report [--json FILE]              # their table

`prepare` needs the git mirrors (bench/real/restore.py); it writes bench/real/work/<id>/ (git-ignored),
which travels to the GPU machine. `run` makes the synthetic data (runs.toml, synth.py) and, per
script: the loops `graphify rewrite` finds and what it does with each (with the hand label of the
loop: a refusal is true when the label says the loop cannot be captured whole), `graphify verify` of
the first rewritten loop (teacher-forced, step speedup), and the whole run of the original and of the
rewrite to the end with the same arguments, N times each, alternating (median wall time and every
time, and whether the rewrite fell back to eager).

`long` times whole runs only, at the length a run's `long` names (runs.toml): the synthetic data is small
so that `run` takes seconds a script, and then the few seconds of start-up (importing torch, starting
CUDA, reading the data) are most of a run; a real training run is thousands of steps, where they are not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORK = HERE / "work"
RUNS = HERE / "runs.toml"
RUN_PARTS = HERE / "runs.d"
sys.path[:0] = [str(HERE), str(ROOT)]

from restore import _git, _git_dir, load_manifest, restore_one  # noqa: E402

WHOLE_RUN_TIMEOUT = 90
LONG_RUN_TIMEOUT = 180
VERIFY_TIMEOUT = 240
FALLBACK = "GraphifyFallbackWarning"  # the runtime's one warning when a step runs eagerly


def load_runs() -> tuple[list[dict], dict[str, str]]:
    """runs.toml, then each domain's part in runs.d/ (named as its manifest.d/ part)."""
    runs: list[dict] = []
    not_run: dict[str, str] = {}
    for path in [RUNS, *sorted(RUN_PARTS.glob("*.toml"))]:
        with path.open("rb") as handle:
            doc = tomllib.load(handle)
        runs += doc.get("run", [])
        not_run.update(doc.get("not_run", {}))
    return runs, not_run


def script_path(entry: dict) -> Path:
    return WORK / entry["id"] / entry["path"]


def prepare(mirrors: Path, only: list[str] | None) -> int:
    manifest = {e["id"]: e for e in load_manifest()}
    runs, _ = load_runs()
    runs = [run for run in runs if not only or run["id"] in only]
    failures = 0
    for run in runs:
        entry = manifest[run["id"]]
        root = WORK / entry["id"]
        problem = restore_one(entry, mirrors, root, target=script_path(entry))
        if problem is None:
            problem = _restore_support(entry, run.get("support", []), mirrors, root)
        if problem:
            failures += 1
            print(f"{entry['id']}: {problem}", file=sys.stderr)
    print(f"prepared {len(runs) - failures} runs under {WORK}")
    return 1 if failures else 0


def _restore_support(entry: dict, paths: list[str], mirrors: Path, root: Path) -> str | None:
    git_dir = _git_dir(mirrors, entry["repo"])
    for path in paths:
        try:
            listing = _git(git_dir, "ls-tree", "-r", "--name-only", entry["commit"], "--", path).decode().split("\n")
            for name in filter(None, listing):
                target = root / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(_git(git_dir, "show", f"{entry['commit']}:{name}"))
        except subprocess.CalledProcessError as error:
            return f"{path}: {error.stderr.decode().strip()}"
    return None


def _environment(run: dict) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TQDM_DISABLE="1", MPLBACKEND="Agg")
    if run.get("cifar_shim"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE / "shim"), env.get("PYTHONPATH")]))
    if run.get("wandb_shim"):  # Weights & Biases without an account or network: its calls do nothing
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE / "shim" / "wandb"), env.get("PYTHONPATH")]))
    if run.get("datasets_shim"):  # Hugging Face `datasets` reading a local image folder
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE / "shim" / "datasets"), env.get("PYTHONPATH")]))
    if run.get("root_on_path"):  # the repository's own packages, importable as an installed checkout has them
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORK / run["id"]), env.get("PYTHONPATH")]))
    for name in run.get("shims", []):  # stand-ins for packages the GPU machine lacks: bench/real/shim/<name>/
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE / "shim" / name), env.get("PYTHONPATH")]))
    if run.get("terminal_shim"):  # `stty size` answers without a terminal
        env["PATH"] = os.pathsep.join([str(HERE / "shim" / "bin"), env.get("PATH", "")])
    for name, value in run.get("env", {}).items():  # `{root}`: the run's repository root
        env[name] = value.format(root=WORK / run["id"])
    return env


def _missing_modules(run: dict) -> list[str]:
    import importlib.util

    return [m for m in run.get("modules", []) if importlib.util.find_spec(m) is None]


def generators() -> dict:
    """The data generators a run's `make` names: bench/real/synth.py's, then bench/real/shim/synth_extra.py's."""
    import importlib.util

    from synth import GENERATORS

    spec = importlib.util.spec_from_file_location("synth_extra", HERE / "shim" / "synth_extra.py")
    extra = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extra)
    return {**GENERATORS, **extra.GENERATORS}


def _make_data(run: dict, data: list[dict] | None = None) -> None:
    """The run's synthetic data (`data`, or the given specs: a long run's). The generators skip a place
    already made, so a place last made from another spec (a long run's larger set) is removed first: the
    specs made last are kept beside the run's work folder."""
    made = generators()
    record = WORK / run["id"] / ".synth-specs.json"
    before = json.loads(record.read_text()) if record.exists() else {}
    for spec in run.get("data", []) if data is None else data:
        options = {k: v for k, v in spec.items() if k not in ("make", "at")}
        place = WORK / run["id"] / spec["at"]  # an absolute `at` is that path
        stale = before.get(str(place), spec) != spec
        if stale and place.is_dir():
            shutil.rmtree(place)
        elif stale:
            place.unlink(missing_ok=True)
        made[spec["make"]](place, **options)
        before[str(place)] = spec
        record.write_text(json.dumps(before, indent=1))


def loop_outcomes(script_id: str, script: Path) -> tuple[list[dict], str | None]:
    """Each loop graphify finds in the script, what rewrite does with it and its hand label; and the
    rewritten text (None when no loop is rewritten)."""
    from score import LABELS, load_labels

    from graphify.rewrite import rewrite_source

    label_path = LABELS / f"{script_id}.toml"
    labels = {lp["line"]: lp["verdict"] for lp in load_labels(label_path).get("loop", [])} if label_path.exists() else {}
    result = rewrite_source(script.read_text(), str(script))
    loops = [
        {
            "line": o.line,
            "kind": o.kind,
            "verdict": o.verdict.value,
            "rewritten": o.rewritten,
            "model_only": o.model_only,
            "codes": sorted(set(o.reasons)),
            "label": labels.get(o.line),
        }
        for o in result.outcomes
    ]
    return loops, result.code if any(loop["rewritten"] for loop in loops) else None


def _verify(script: Path, run: dict) -> dict:
    command = [
        sys.executable,
        "-m",
        "graphify",
        "verify",
        str(script),
        "--json",
        "--keep",
        "--timeout",
        str(VERIFY_TIMEOUT),
        *(["--steps", str(run["verify_steps"])] if "verify_steps" in run else []),
        "--",
        *run.get("args", []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=_environment(run), cwd=script.parent)
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"status": "error", "message": (done.stderr or done.stdout).strip()[-300:]}
    runs = doc.get("runs") or {}
    notes = []
    if doc.get("workdir"):  # what the rewrite's runtime said (a fallback to eager and its reason)
        stderr = Path(doc["workdir"]) / "rewrite.stderr"
        notes = [line[:300] for line in stderr.read_text().splitlines() if FALLBACK in line] if stderr.exists() else []
        shutil.rmtree(doc["workdir"], ignore_errors=True)
    return {
        "status": doc["status"],
        "message": doc.get("message"),
        "speedup": doc.get("speedup"),
        "warnings": doc.get("warnings"),
        "runtime_notes": notes[:5],
        "loop": (doc.get("loop") or {}).get("line"),
        "verdict": doc.get("verdict"),
        "ms_per_step": {k: v.get("ms_per_step") for k, v in runs.items()},
        "setup_s": {k: v.get("setup_s") for k, v in runs.items()},
        "steps_compared": (doc.get("tolerance") or {}).get("steps_compared"),
        "on_cuda": doc.get("on_cuda"),
        "time_split": {k: v.get("time_split") for k, v in runs.items()},  # where each version's time goes
        "time_verdict": doc.get("time_verdict"),
        "step_verdict": doc.get("verdict"),
    }


def _whole_run(script: Path, run: dict, timeout: int = WHOLE_RUN_TIMEOUT) -> dict:
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, script.name, *run.get("args", [])],
            capture_output=True,
            text=True,
            env=_environment(run),
            cwd=script.parent,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": f"over {timeout} s"}
    seconds = time.perf_counter() - started
    if done.returncode:
        return {"ok": False, "why": (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1][:200]}
    fell_back = FALLBACK in done.stderr
    return {"ok": True, "seconds": round(seconds, 2), "fell_back": fell_back}


def notebook_script(notebook: Path) -> Path:
    """The notebook's code cells, in order, as a script beside it (`<stem>.py`): the module graphify reads
    of a notebook (graphify.notebooks), every line at its place. Dropped, each as `pass` on its line: line
    magics (`%matplotlib inline`, `%load_ext x`), shell escapes (`!pip install x`), help (`x?`); `y = !x`
    becomes `y = None`; a cell magic other than %%time/%%timeit/%%capture/%%prun blanks its whole cell
    (`%%bash`, `%%writefile`), and a `from __future__` import becomes `pass`. The rest runs as written:
    a cell's last expression is evaluated without being displayed, and what the notebook imports from
    IPython for display (`display`, `clear_output`) comes from IPython, or the `IPython` stand-in of a run's
    `shims` where the machine lacks it."""
    from graphify.notebooks import read_notebook

    script = notebook.with_suffix(".py")
    script.write_text(read_notebook(str(notebook)).source)
    return script


def _cells_refusal(notebook: Path, rewritten: str) -> str | None:
    """Why the rewrite of a notebook's script could not be written back into its cells (as `graphify
    rewrite` of the notebook would refuse it), or None."""
    from graphify.notebooks import CellSpanError, read_notebook

    try:
        read_notebook(str(notebook)).with_source(rewritten)
    except CellSpanError as error:
        return str(error)
    return None


def run_one(entry: dict, run: dict, repeat: int = 3) -> dict:
    record: dict = {"id": entry["id"], "repo": entry["repo"], "path": entry["path"]}
    script = script_path(entry)
    if not script.exists():
        return dict(record, skipped="not prepared (python bench/real/run.py prepare)")
    missing = _missing_modules(run)
    if missing:
        return dict(record, skipped="missing modules: " + ", ".join(missing))
    notebook = script if script.suffix == ".ipynb" else None
    if notebook:
        script = notebook_script(notebook)
    record["loops"], rewritten = loop_outcomes(entry["id"], script)
    if rewritten is None:
        return record
    if notebook and (refusal := _cells_refusal(notebook, rewritten)):
        record["notebook_cells"] = refusal  # `graphify rewrite` leaves the notebook as it is; the script's rewrite runs
    _make_data(run)
    record["verify"] = _verify(script, run)
    record["cuda_used"] = bool(record["verify"].get("on_cuda"))
    graphified = script.with_name(script.stem + "_graphified.py")
    graphified.write_text(rewritten)
    if run.get("whole_run", True):
        record["whole_run"] = _whole_runs(script, graphified, run, repeat)
    return record


def _whole_runs(script: Path, graphified: Path, run: dict, repeat: int, timeout: int = WHOLE_RUN_TIMEOUT) -> dict:
    """Each version `repeat` times, alternating (eager first), so that drift of the machine hits both
    alike; the median, and every time, to tell a difference from run-to-run spread. A failed run ends
    the timing: it is what that version reports; the other reports the runs it finished, if any."""
    times: dict[str, list] = {"eager": [], "graphify": []}
    failed: dict[str, dict] = {}
    for _ in range(repeat):
        for name, path in (("eager", script), ("graphify", graphified)):
            done = _whole_run(path, run, timeout)
            if not done["ok"]:
                failed[name] = done
                break
            times[name].append(done)
        if failed:
            break
    return {name: failed.get(name) or _timed(runs) for name, runs in times.items()}


def _timed(runs: list[dict]) -> dict:
    if not runs:
        return {"ok": False, "why": "not run: the other version failed first"}
    return {
        "ok": True,
        "seconds": statistics.median(d["seconds"] for d in runs),
        "runs": [d["seconds"] for d in runs],
        "fell_back": any(d["fell_back"] for d in runs),
    }


def run_all(only: list[str] | None, out: Path, repeat: int = 3) -> int:
    manifest = {e["id"]: e for e in load_manifest()}
    runs, not_run = load_runs()
    records, device = _kept(out, only)
    for run in runs:
        if only and run["id"] not in only:
            continue
        started = time.perf_counter()
        record = run_one(manifest[run["id"]], run, repeat)
        record["seconds"] = round(time.perf_counter() - started, 1)
        record["device"] = _device()  # this machine's: a record kept from the earlier run keeps its own
        print(json.dumps(record), flush=True)
        records.append(record)
        _save(out, records, device)
    for script_id, why in not_run.items():
        if not only:
            entry = manifest[script_id]
            records.append({"id": script_id, "repo": entry["repo"], "path": entry["path"], "skipped": why})
    _save(out, records, device)
    return 0


def _kept(out: Path, only: list[str] | None) -> tuple[list[dict], str]:
    """`--only` updates those scripts' records: the other records of an earlier run in `out`, and its
    device; none, and this machine's device, otherwise."""
    earlier = json.loads(out.read_text()) if only and out.exists() else None
    if earlier is None:
        return [], _device()
    return [r for r in earlier["records"] if r["id"] not in only], earlier["device"]


def long_all(only: list[str] | None, out: Path, repeat: int) -> int:
    """Whole runs, original and rewrite alternating, at each run's `long` length: its data specs and
    arguments (`data` and `args` where `long` names none). A run without `long` is not timed."""
    manifest = {e["id"]: e for e in load_manifest()}
    runs, _ = load_runs()
    records, device = _kept(out, only)
    for run in runs:
        if "long" not in run or (only and run["id"] not in only):
            continue
        long_run = dict(run, args=run["long"].get("args", run.get("args", [])))
        record = {"id": run["id"], "long": run["long"], "whole_run": _long_run(manifest[run["id"]], long_run, repeat)}
        print(json.dumps(record), flush=True)
        records.append(record)
        _save(out, records, device)
    return 0


def _long_run(entry: dict, run: dict, repeat: int) -> dict:
    script = script_path(entry)
    if not script.exists():
        return {"skipped": "not prepared (python bench/real/run.py prepare)"}
    _, rewritten = loop_outcomes(entry["id"], script)
    if rewritten is None:
        return {"skipped": "no loop rewritten"}
    _make_data(run, run["long"].get("data"))
    graphified = script.with_name(script.stem + "_graphified.py")
    graphified.write_text(rewritten)
    return _whole_runs(script, graphified, run, repeat, LONG_RUN_TIMEOUT)


def _save(out: Path, records: list[dict], device: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"records": records, "device": device}, indent=1))


def _device() -> str:
    try:
        import torch

        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
        return f"{name}, torch {torch.__version__}"
    except ImportError:
        return "no torch"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_prepare = sub.add_parser("prepare")
    p_prepare.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    p_prepare.add_argument("--only", nargs="*")
    p_run = sub.add_parser("run")
    p_run.add_argument("--only", nargs="*")
    p_run.add_argument("--json", type=Path, default=ROOT / "bench/results/real_run.json")
    p_run.add_argument("--repeat", type=int, default=3, help="whole runs of each version, alternating (median reported)")
    p_report = sub.add_parser("report")
    p_report.add_argument("--json", type=Path, default=ROOT / "bench/results/real_run.json")
    p_report.add_argument("--out", type=Path, default=ROOT / "bench/results/real_run.md")
    p_long = sub.add_parser("long", help="whole runs at each run's `long` length, original and rewrite alternating")
    p_long.add_argument("--only", nargs="*")
    p_long.add_argument("--json", type=Path, default=ROOT / "bench/results/real_run_long.json")
    p_long.add_argument("--repeat", type=int, default=2)
    p_long_report = sub.add_parser("long-report", help="the table of the long whole runs")
    p_long_report.add_argument("--json", type=Path, default=ROOT / "bench/results/real_run_long.json")
    p_split = sub.add_parser("time-split", help="the time split of each verified script, original against rewrite")
    p_split.add_argument("--json", type=Path, default=ROOT / "bench/results/real_run.json")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare(args.mirrors, args.only)
    if args.command == "run":
        return run_all(args.only, args.json, args.repeat)
    if args.command == "long":
        return long_all(args.only, args.json, args.repeat)
    from run_report import long_run_table, time_split_table, write_report

    if args.command == "long-report":
        print("\n".join(long_run_table(json.loads(args.json.read_text())["records"])))
        return 0

    if args.command == "time-split":
        print("\n".join(time_split_table(json.loads(args.json.read_text())["records"])))
        return 0
    return write_report(args.json, args.out)


if __name__ == "__main__":
    sys.exit(main())
