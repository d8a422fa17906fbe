"""How fast is `graphify check`? Side by side with TorchFix, in one run, on one machine.

Measures
  1. the installed torch package (~2,300 files, ~46 MB): `graphify check TORCH_DIR` as one process
     (wall time, CPU time, files/s, MB/s, files analysed vs files that gave an error);
  2. one ~300-line training script (bench/data/train_classifier.py) as a whole process, the
     pre-commit case: median of N runs of `python -m graphify check FILE`, with the floor under it
     (`graphify check` on a file with no loop, `python -c pass`, `python -c "import libcst"`) so
     the numbers can be read;
  3. TorchFix on the same tree and the same script (`torchfix` from PATH, or installed with pip
     into its own virtualenv: it pins libcst<1.6, which must not replace graphify's libcst).

    python bench/check_speed.py                      # writes bench/results/check_speed.md
    python bench/check_speed.py --skip-torchfix --runs 5 --out /tmp/speed.md

Timings from different machines are not comparable; ratios from one run are.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "data" / "train_classifier.py"
DEFAULT_OUT = REPO / "bench" / "results" / "check_speed.md"
DEFAULT_TORCHFIX_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "graphify-bench" / "torchfix-venv"


def torch_dir() -> str:
    spec = importlib.util.find_spec("torch")  # where `import torch` would load it from, without importing it
    if spec is None or not spec.submodule_search_locations:
        sys.exit("torch is not installed: pass --tree DIR")
    return list(spec.submodule_search_locations)[0]


# Timed as users run it, from the bytecode cache that the warm-up run writes, even where this shell
# turns that cache off (every run would compile graphify's modules again).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float, float]:
    """(result, wall seconds, CPU seconds of the process and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, env=CHILD_ENV, **kwargs)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result, wall, cpu


def median_wall(cmd: list[str], runs: int, ok=(0, 1)) -> dict:
    timed(cmd)  # warm the file cache and the .pyc files; not counted
    walls = []
    for _ in range(runs):
        result, wall, _ = timed(cmd)
        if result.returncode not in ok:
            raise SystemExit(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stderr[-2000:]}")
        walls.append(wall)
    return {"median": statistics.median(walls), "min": min(walls), "max": max(walls), "runs": runs}


def corpus(tree: str) -> tuple[list[str], int]:
    sys.path.insert(0, str(REPO))
    from graphify.config import Settings
    from graphify.files import discover

    files, _ = discover([tree], Settings())
    return files, sum(os.path.getsize(f) for f in files)


def error_kind(message: str) -> str:
    message = re.sub(r"^.*?:\d+: ", "", message)  # "path:line: syntax error..." -> "syntax error..."
    return re.split(r"[(:]", message, maxsplit=1)[0].strip()


def run_graphify_tree(tree: str, files: list[str], jobs: int) -> dict:
    cmd = [sys.executable, "-m", "graphify", "check", tree, "--format", "json", "--exit-zero", "--jobs", str(jobs)]
    result, wall, cpu = timed(cmd, cwd=REPO)
    try:
        doc = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"graphify check gave no JSON (exit {result.returncode}):\n{result.stderr[-2000:]}") from None
    failed = {e["path"] for e in doc["errors"]}
    kinds = collections.Counter(error_kind(e["message"]) for e in doc["errors"])
    return {
        "wall": wall,
        "cpu": cpu,
        "exit": result.returncode,
        "files_analysed": len(set(files) - failed),
        "files_failed": len(failed),
        "diagnostics": len(doc["diagnostics"]),
        "loops": len(doc["loops"]),
        "error_kinds": kinds.most_common(),
    }


def find_torchfix(venv: Path, install: bool) -> str | None:
    exe = shutil.which("torchfix")
    if exe:
        return exe
    exe = venv / "bin" / "torchfix"
    if exe.exists():
        return str(exe)
    if not install:
        return None
    print(f"installing torchfix into {venv} ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "torchfix"], check=True)
    return str(exe)


def torchfix_version(exe: str) -> str:
    return subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()


def run_torchfix_tree(exe: str, tree: str, jobs: int) -> dict:
    result, wall, cpu = timed([exe, "--jobs", str(jobs), tree])
    checked = re.search(r"Finished checking (\d+) files", result.stderr)
    return {
        "wall": wall,
        "cpu": cpu,
        "exit": result.returncode,
        "files_checked": int(checked.group(1)) if checked else None,
        "diagnostics": len(re.findall(r"^.+:\d+:\d+: TOR\d+", result.stdout, re.M)),
    }


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
        cpu = model or cpu
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for dist in ("torch-graphify", "libcst", "torch"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    return ", ".join(parts)


def report(args, tree, files, size, g_tree, g_one, floor, tf) -> str:
    mb = size / 1e6
    n = len(files)
    lines = [
        "# `graphify check` speed",
        "",
        f"Generated by `python bench/check_speed.py` on {time.strftime('%Y-%m-%d %H:%M')}.",
        f"Machine: {machine()}. Versions: {versions()}." + (f" TorchFix: {tf['version']}." if tf else ""),
        "Timings from another machine are not comparable; compare the ratios within this file.",
        "",
        f"## Whole tree: {'a folder' if args.tree else 'the installed torch package'} ({n} `.py` files, {mb:.1f} MB, `--jobs {args.jobs}`)",
        "",
        f"Tree: `{tree}`",
        "",
        "Wall time depends on what else the machine runs; CPU time (all processes) much less so.",
        "",
        "| tool | wall s | CPU s | CPU ms/file | files/s | MB/s | files analysed | files with errors | diagnostics | loops |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| graphify check | {g_tree['wall']:.1f} | {g_tree['cpu']:.1f} | {1000 * g_tree['cpu'] / n:.0f} | {n / g_tree['wall']:.1f} | "
        f"{mb / g_tree['wall']:.2f} | {g_tree['files_analysed']} | {g_tree['files_failed']} | {g_tree['diagnostics']} | {g_tree['loops']} |",
    ]
    if tf:
        t = tf["tree"]
        lines.append(
            f"| torchfix | {t['wall']:.1f} | {t['cpu']:.1f} | {1000 * t['cpu'] / n:.0f} | {n / t['wall']:.1f} | {mb / t['wall']:.2f} | "
            f"{t['files_checked'] if t['files_checked'] is not None else '?'} (containing `torch`) | "
            f"{'exit ' + str(t['exit']) if t['exit'] else 0} | {t['diagnostics']} | n/a |"
        )
    if g_tree["error_kinds"]:
        lines += ["", "graphify errors by kind: " + ", ".join(f"{k} ({c})" for k, c in g_tree["error_kinds"]) + "."]
    lines += [
        "",
        f"## One script as a whole process (the pre-commit case): `{SCRIPT.relative_to(REPO)}`, {sum(1 for _ in open(SCRIPT))} lines",
        "",
        f"Median of {args.runs} runs after one warm-up run.",
        "",
        "| command | median s | min s | max s |",
        "|---|---:|---:|---:|",
    ]
    rows = [("python -m graphify check FILE", g_one), ("python -m graphify check NO_LOOP_FILE (fixed cost)", floor["graphify"])]
    if tf:
        rows.append(("torchfix FILE", tf["one"]))
    rows += [("python -c pass (interpreter start-up)", floor["python"]), ('python -c "import libcst"', floor["libcst"])]
    for name, r in rows:
        lines.append(f"| `{name}` | {r['median']:.3f} | {r['min']:.3f} | {r['max']:.3f} |")
    lines += [
        "",
        f"Budget: under 0.4 s for `graphify check` on one ~300-line file: "
        f"{'met' if g_one['median'] < 0.4 else 'NOT met'} ({g_one['median']:.3f} s).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", help="folder to check (default: the installed torch package)")
    parser.add_argument("--runs", type=int, default=10, help="runs of the single-file measurement (default 10)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="--jobs for both tools (default: CPU count)")
    parser.add_argument("--skip-torchfix", action="store_true")
    parser.add_argument("--torchfix-venv", type=Path, default=DEFAULT_TORCHFIX_VENV)
    parser.add_argument("--no-install", action="store_true", help="do not pip install torchfix when it is missing")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    tree = args.tree or torch_dir()
    files, size = corpus(tree)
    print(f"{len(files)} files, {size / 1e6:.1f} MB under {tree}", file=sys.stderr)

    print("graphify check on the tree ...", file=sys.stderr)
    g_tree = run_graphify_tree(tree, files, args.jobs)
    print(f"  {g_tree['wall']:.1f} s", file=sys.stderr)
    print("graphify check on one script ...", file=sys.stderr)
    g_one = median_wall([sys.executable, "-m", "graphify", "check", str(SCRIPT)], args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        no_loop = Path(tmp) / "no_loop.py"
        no_loop.write_text("import torch\n\nx = torch.zeros(3)\n")
        fixed = median_wall([sys.executable, "-m", "graphify", "check", str(no_loop)], args.runs, ok=(0,))
    floor = {
        "graphify": fixed,
        "python": median_wall([sys.executable, "-c", "pass"], args.runs, ok=(0,)),
        "libcst": median_wall([sys.executable, "-c", "import libcst"], args.runs, ok=(0,)),
    }

    tf = None
    if not args.skip_torchfix:
        exe = find_torchfix(args.torchfix_venv, install=not args.no_install)
        if exe is None:
            print("torchfix not found (--no-install): skipped", file=sys.stderr)
        else:
            print("torchfix on the tree ...", file=sys.stderr)
            tf = {"version": torchfix_version(exe), "tree": run_torchfix_tree(exe, tree, args.jobs)}
            print(f"  {tf['tree']['wall']:.1f} s", file=sys.stderr)
            print("torchfix on one script ...", file=sys.stderr)
            tf["one"] = median_wall([exe, str(SCRIPT)], args.runs)

    text = report(args, tree, files, size, g_tree, g_one, floor, tf)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
