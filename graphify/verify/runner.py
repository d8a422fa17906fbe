"""Runs one version of a script in its own process (graphify.verify.child) and reads what it recorded."""

from __future__ import annotations

import json
import os
import signal
import statistics
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from graphify.verify import child

SETUP_STEPS = 4  # steps 1-4 (after the first): warmup and capture in the rewrite
TAIL_CHARS = 3000


@dataclass
class RunResult:
    label: str  # "original" | "rewrite"
    returncode: int
    stderr_tail: str = ""
    timed_out: bool = False
    data: dict = field(default_factory=dict)  # OUT.json of the child
    tensors: dict = field(default_factory=dict)  # {"params": {...}, "state": {...}}

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.data)

    @property
    def steps(self) -> int:
        return len(self.data.get("times", []))

    @property
    def durations(self) -> list[float]:
        """Seconds between consecutive probes: the duration of steps 2, 3, ... (step 1 includes the
        script's own start-up and is not timed)."""
        t = self.data.get("times", [])
        return [b - a for a, b in zip(t, t[1:])]

    def _steady(self) -> list[float]:
        d = self.durations
        end = len(d) - self.data.get("profiled_steps", 0)  # the profiler slows the steps it watches
        return d[SETUP_STEPS:end] or d[SETUP_STEPS:]  # nothing when the loop stopped within warmup and capture

    @property
    def step_ms(self) -> float | None:
        steady = self._steady()
        return statistics.median(steady) * 1e3 if steady else None

    @property
    def setup_s(self) -> float | None:
        """Time of the first steps beyond steady steps: warmup and capture (rewrite), lazy init (both)."""
        d = self.durations
        if len(d) < SETUP_STEPS + 3:
            return None
        return max(0.0, sum(d[:SETUP_STEPS]) - SETUP_STEPS * statistics.median(self._steady()))


def run_version(
    label: str,
    code: str,
    script: str,
    steps: int,
    args: Sequence[str],
    workdir: str,
    *,
    profile: bool = False,
    states_out: str | None = None,
    states_in: str | None = None,
    until_reentry: int | None = None,
    timeout: float | None = None,
    on_step: Callable[[int], None] | None = None,
    time_split: bool = False,
) -> RunResult:
    """Write `code` as `workdir/label/<script name>` and run it as if it were `script`. With `time_split`,
    the child splits the run's time into parts (timing.py), counted from the process start."""
    folder = os.path.join(workdir, label)
    os.makedirs(folder, exist_ok=True)
    copy = os.path.join(folder, os.path.basename(script))
    with open(copy, "w", encoding="utf-8") as f:
        f.write(code)
    out = os.path.join(workdir, f"{label}.json")
    progress = out[:-5] + ".progress"
    cmd = [sys.executable, child.__file__, copy, out, str(steps), "--as", os.path.abspath(script)] + ["--profile"] * profile
    for flag, value in (("--states-out", states_out), ("--states-in", states_in), ("--until-reentry", until_reentry)):
        if value:
            cmd += [flag, str(value)]
    cwd = os.path.dirname(os.path.abspath(script))
    before = _files_under(cwd)
    env = child_env()
    # its own temporary folder: a snapshot saved to tempfile.gettempdir() is not the next version's to resume from
    env["TMPDIR"] = os.path.join(workdir, f"{label}.tmp")
    os.makedirs(env["TMPDIR"], exist_ok=True)
    with open(os.path.join(workdir, f"{label}.stdout"), "wb") as stdout, open(os.path.join(workdir, f"{label}.stderr"), "wb") as stderr:
        proc = subprocess.Popen(
            cmd + (["--time-split", "--started", repr(time.time())] if time_split else []) + ["--", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        timed_out = _wait(proc, progress, timeout, on_step)
    _move_created(cwd, before, os.path.join(workdir, f"{label}.created"), _written_by(out[:-5] + ".written"))
    result = RunResult(label, proc.returncode, _tail(workdir, label), timed_out)
    if proc.returncode == 0 and os.path.exists(out):
        with open(out) as f:
            result.data = json.load(f)
        import torch

        result.tensors = torch.load(out[:-5] + ".pt", map_location="cpu", weights_only=True)
    return result


_MAX_FILES = 50_000  # a folder bigger than this is not tracked (created files stay where they are)


def _files_under(folder: str) -> set[str] | None:
    """Every file and folder under `folder` (relative paths), or None when there are too many to track."""
    found: set[str] = set()
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in (".git", "__pycache__")]
        rel = os.path.relpath(root, folder)
        found.update(os.path.normpath(os.path.join(rel, name)) for name in dirs + files)
        if len(found) > _MAX_FILES:
            return None
    return found


def _written_by(log_path: str) -> set[str]:
    """The paths the child wrote down as written by the run (child._record_created)."""
    try:
        with open(log_path, encoding="utf-8", errors="surrogateescape") as f:
            return set(f.read().splitlines())
    except OSError:
        return set()


def _move_created(folder: str, before: set[str] | None, into: str, written: set[str]) -> None:
    """Move what a run created under `folder` (a checkpoint, a snapshot it would resume from, logs) into
    `into`: the next version starts from the folder as the first found it, and the user's folder is
    left as it was. Only what the run itself wrote (`written`, absolute paths) moves: a file another
    program or the user made there meanwhile stays."""
    after = _files_under(folder) if before is not None else None
    if after is None:
        return
    for rel in sorted(after - before):
        parent = os.path.dirname(rel)
        if parent and parent not in before:
            continue  # inside a folder the run created: moved with it
        path = os.path.join(os.path.realpath(folder), rel)
        if path not in written and not any(w.startswith(path + os.sep) for w in written):
            continue
        target = os.path.join(into, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(os.path.join(folder, rel), target)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return env


def _wait(proc: subprocess.Popen, progress: str, timeout: float | None, on_step) -> bool:
    """Wait for the child, reporting steps; True when it ran out of time (and was killed)."""
    try:
        return _poll(proc, progress, timeout, on_step)
    except BaseException:  # Ctrl-C: the child has its own session and did not get the signal
        _kill(proc)
        raise


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: the script and its workers
    except ProcessLookupError:
        pass
    proc.wait()


def _poll(proc: subprocess.Popen, progress: str, timeout: float | None, on_step) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = -1
    while True:
        try:
            proc.wait(timeout=0.1)
            done = True
        except subprocess.TimeoutExpired:
            done = False
        if on_step is not None:
            steps = os.path.getsize(progress) if os.path.exists(progress) else 0
            if steps != seen:
                seen = steps
                on_step(steps)
        if done:
            return False
        if deadline is not None and time.monotonic() > deadline:
            _kill(proc)
            return True


def _tail(workdir: str, label: str) -> str:
    parts = []
    for stream in ("stderr", "stdout"):
        try:
            with open(os.path.join(workdir, f"{label}.{stream}"), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - TAIL_CHARS))
                text = f.read().decode("utf-8", "replace").strip()
        except OSError:
            text = ""
        if text:
            parts.append(text)
            break  # stderr when there is any, else stdout
    return parts[0] if parts else ""
