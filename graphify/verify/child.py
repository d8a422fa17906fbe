"""Runs one version of a script for `graphify verify`:

    python graphify/verify/child.py SCRIPT OUT.json STEPS [--as PATH] [--profile]
        [--states-out DIR | --states-in DIR] [--time-split [--started EPOCH]] -- ARGS...

(or `python -m graphify.verify.child ...`). It imports nothing from graphify, so the runner starts it
by path and the script's import path stays as if it were run directly.

SCRIPT runs as `__main__` with sys.argv = [PATH] + ARGS, `__file__` = PATH and sys.path[0] = PATH's
folder (PATH: the user's script; SCRIPT: the instrumented copy that actually runs). Random, numpy and
torch are seeded with 0 first. `__graphify_probe__(value, optimizers)`, which instrumentation put after
the step, records each step; after STEPS steps it writes OUT.json and OUT.pt (final parameters and
optimizer state) and ends the script. A script that ends on its own is recorded as far as it got.
With --until-reentry MAX the run goes on past STEPS, up to MAX steps, until the loop has been entered a
second time and run 10 steps there (a `train()` called per epoch). With --states-out DIR the run saves its state after each step; with --states-in DIR it loads the saved
state after each step and records how far its own state was from it (teacher forcing, forcing.py).
Step times exclude that work. With --time-split the run's wall clock, from EPOCH (time.time() when the
runner started this process), is split into start-up, data wait, copies, step, host reads, evaluation
and the rest (timing.py, loaded by path like forcing.py).
"""

from __future__ import annotations

import argparse
import builtins
import json
import os
import random
import sys
import time
import traceback
import types
import warnings

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch", "cuGraphLaunch")
PROFILED_STEPS = 5
REENTRY_STEPS = 10  # steps compared after the loop was entered again
_IMPORTED = time.perf_counter()  # where the run's time split starts when the runner gave no process start


class StopScript(BaseException):
    """Raised by the probe after the last step; a BaseException so that `except Exception` in the
    script does not swallow it."""


class Recorder:
    def __init__(self, torch, steps: int, out: str, profile: bool, progress_fd: int, forcing=None, until_reentry=None) -> None:
        self.torch, self.steps, self.out, self.profile, self.progress_fd = torch, steps, out, profile, progress_fd
        self.until_reentry = until_reentry  # run past `steps`, up to this many, until the loop was entered again
        self.entries: list[int] = []  # steps done when the loop was entered
        self.lrs: list[list[float]] = []  # each optimizer's first learning rate, per step
        self.forcing = forcing
        self.paused = 0.0  # seconds spent saving and loading states, kept out of the step times
        self.times: list[float] = []
        self.values: list[list[float]] = []
        self.optimizers: tuple = ()
        self.profiler = None
        self.profile_start = 0.0
        self.profile_result: dict | None = None
        self.start = time.perf_counter()
        self.sync = torch.cuda.synchronize  # the probe's own: not the wrapped one, which times host reads
        self.split = None  # timing.TimeSplit, with --time-split

    def __call__(self, value, optimizers=None, carried=()) -> None:
        torch = self.torch
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            self.sync()
        end = time.perf_counter()
        if self.split is not None:
            self.split.step_end(end)  # the step ends here; what follows up to the script is verify's own work
        self.times.append(end - self.paused)
        self.values.append(_floats(torch, value))
        if optimizers is not None:
            self.optimizers = tuple(optimizers) if isinstance(optimizers, (tuple, list)) else (optimizers,)
        self.lrs.append([float(opt.param_groups[0]["lr"]) for opt in self.optimizers if opt.param_groups])
        os.write(self.progress_fd, b".")
        n = len(self.times)
        if self.forcing is not None:
            self.forcing.after_step(n, self.optimizers, carried)
            if cuda:
                self.sync()
            self.paused += time.perf_counter() - end
        if self.profile and cuda and n == self.steps - PROFILED_STEPS and n >= 15:  # well after capture
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
            self.profiler.__enter__()
            # the profiler's own start-up is not a step; on the clock of self.times, which leaves out saving and loading states
            self.profile_start = time.perf_counter() - self.paused
        if n >= self.steps:
            self._stop_profiler()
        if self._done(n):
            if self.split is not None:
                self.split.stop(end)
            raise StopScript
        if self.split is not None and self.profiler is None:  # the profiled steps stay out of the time split
            self.split.resume(time.perf_counter())

    def _done(self, n: int) -> bool:
        if self.until_reentry is None:
            return n >= self.steps
        again = self.entries[1] if len(self.entries) > 1 else None
        return n >= self.until_reentry or (n >= self.steps and again is not None and n - again >= REENTRY_STEPS)

    def enter(self) -> None:
        """Called just before the probed loop starts."""
        self.entries.append(len(self.times))
        if self.split is not None:
            self.split.enter(time.perf_counter())

    def data(self, iterable):
        """`for x in __graphify_probe__.data(loader):` the probed loop's iterable, its `next()` timed."""
        return iterable if self.split is None else self.split.iterate(iterable)

    def other(self, line: int) -> None:
        """Called just before another loop of the script (an evaluation loop) starts."""
        if self.split is not None:
            self.split.other(line, time.perf_counter())

    def other_end(self, line: int) -> None:
        """Called just after that loop."""
        if self.split is not None:
            self.split.other_end(line, time.perf_counter())

    def _stop_profiler(self) -> None:
        if self.profiler is None:
            return
        prof, self.profiler = self.profiler, None
        prof.__exit__(None, None, None)
        try:
            self.profile_result = _summarize(prof.events(), self.times[-1] - self.profile_start, PROFILED_STEPS)
        except Exception as exc:  # the profiler is a bonus: never fail the run for it
            self.profile_result = {"error": f"{type(exc).__name__}: {exc}"}

    def finish(self, ended: str) -> None:
        torch = self.torch
        if self.split is not None:
            self.split.stop(time.perf_counter())  # a script that ended on its own: its end (else the last probe)
        self._stop_profiler()
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        params, state, params_on_cuda = _optimizer_tensors(torch, self.optimizers)
        torch.save({"params": params, "state": state}, self.out[:-5] + ".pt")
        data = {
            "ended": ended,
            "start": self.start,
            "times": self.times,
            "values": self.values,
            "profile": self.profile_result,
            "profiled_steps": PROFILED_STEPS if self.profile_result else 0,
            "cuda": cuda,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "on_cuda": params_on_cuda if params else cuda,  # decides the default tolerances
            "precision": _precision(torch, params),  # so does this
            "peak_memory": torch.cuda.max_memory_allocated() if cuda else None,
            "graphs": _captured_graphs(),
            "fallbacks": _FALLBACKS[:5],
            "entries": self.entries,
            "lrs": self.lrs,
            "time_split": self.split.summary() if self.split is not None else None,
        }
        if self.forcing is not None and self.forcing.mode == "force":
            data["forced"] = {"steps": self.forcing.forced, "metrics": self.forcing.metrics}
        with open(self.out, "w") as f:
            json.dump(data, f)


def _floats(torch, value) -> list[float]:
    if value is None:
        return []
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _floats(torch, v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _floats(torch, v)]
    if torch.is_tensor(value):
        return [float(value.detach().double().sum())]
    try:
        return [float(value)]
    except (TypeError, ValueError):
        return []


_AUTOCAST_DTYPES: set = set()


def _record_autocast(torch) -> None:
    """Remember the dtypes that CUDA autocast regions computed in."""
    autocast = torch.amp.autocast_mode.autocast
    enter = autocast.__enter__

    def recorded(self):
        if getattr(self, "_enabled", False) and getattr(self, "device", None) == "cuda":
            _AUTOCAST_DTYPES.add(str(self.fast_dtype).replace("torch.", ""))
        return enter(self)

    autocast.__enter__ = recorded


def _precision(torch, params: dict) -> str:
    """The narrowest floating-point type the training computed in: parameters and autocast regions."""
    dtypes = {str(t.dtype).replace("torch.", "") for t in params.values() if t.is_floating_point()} | _AUTOCAST_DTYPES
    for name in ("bfloat16", "float16", "float32"):  # fewest mantissa bits first
        if name in dtypes:
            return name
    return "float64" if dtypes else "float32"


def _optimizer_tensors(torch, optimizers) -> tuple[dict, dict, bool]:
    params, state, on_cuda = {}, {}, False
    for oi, opt in enumerate(optimizers):
        for gi, group in enumerate(opt.param_groups):
            prefix = f"optimizer{oi}.group{gi}"
            lr = group.get("lr")
            if lr is not None:
                state[f"{prefix}.lr"] = torch.tensor(float(lr), dtype=torch.float64)
            for pi, p in enumerate(group["params"]):
                on_cuda = on_cuda or p.is_cuda
                params[f"{prefix}.param{pi}"] = p.detach().cpu().clone()
                for key, v in opt.state.get(p, {}).items():
                    if torch.is_tensor(v):
                        state[f"{prefix}.param{pi}.{key}"] = v.detach().cpu().clone()
    return params, state, on_cuda


def _summarize(events, window_s: float, steps: int) -> dict:
    """Kernels per step, launch calls per step, the CPU time of launch calls over the step time, and
    the share of the step the GPU spent running kernels (the rest it waited for the host)."""
    from torch.autograd import DeviceType

    kernels = launches = graph_launches = 0
    launch_us = kernel_us = 0.0
    for e in events:
        if e.device_type == DeviceType.CUDA:
            if not e.name.startswith(("Memcpy", "Memset")):
                kernels += 1
            kernel_us += e.time_range.elapsed_us()
        elif e.name.split("_v")[0] in LAUNCH_CALLS:  # "cudaLaunchKernel", "cuLaunchKernel_v2"...
            launches += 1
            graph_launches += "Graph" in e.name
            launch_us += e.time_range.elapsed_us()
    return {
        "kernels_per_step": kernels / steps,
        "launches_per_step": launches / steps,
        "graph_launches_per_step": graph_launches / steps,
        "launch_share": (launch_us / 1e6) / window_s if window_s > 0 else None,
        # kernels on several streams may overlap: never more than the whole step
        "gpu_busy_share": min(1.0, (kernel_us / 1e6) / window_s) if window_s > 0 else None,
    }


_CAPTURES: list[int] = []
_FALLBACKS: list[str] = []  # GraphifyFallbackWarning messages, in order


def _count_captures(torch) -> None:
    """Count CUDA graph captures as they happen (the helpers holding them may be gone by the end)."""
    if not torch.cuda.is_available():
        return
    capture_end = torch.cuda.CUDAGraph.capture_end

    def counted(self, *args, **kwargs):
        result = capture_end(self, *args, **kwargs)
        _CAPTURES.append(1)  # a capture that failed is no graph
        return result

    torch.cuda.CUDAGraph.capture_end = counted


def _record_fallbacks() -> None:
    """Keep the runtime's fallback warnings (a step left eager, and why), still shown as usual."""
    show = warnings.showwarning

    def recorded(message, category, *args, **kwargs):
        if category.__name__ == "GraphifyFallbackWarning":
            _FALLBACKS.append(str(message))
        return show(message, category, *args, **kwargs)

    warnings.showwarning = recorded


def _captured_graphs() -> int | None:
    """CUDA graphs captured so far (None without CUDA)."""
    return len(_CAPTURES) if _CAPTURES or _cuda_seen else None


_cuda_seen = False


def _seed(torch) -> None:
    random.seed(0)
    try:
        import numpy

        numpy.random.seed(0)
    except ImportError:
        pass
    torch.manual_seed(0)


def _same_arithmetic(torch) -> None:
    """On CUDA, both versions run with the arithmetic a capture uses, so that what is compared is the
    capture itself: deterministic cuDNN algorithms (its default backward kernels are not bit-reproducible
    run to run) chosen without benchmarking (`cudnn.benchmark = True` in the script is kept off: the
    fastest algorithm by timing differs from process to process, and so do its roundings), and
    `capturable=True` for optimizers that have the flag (CapturedStep switches them on;
    their device-side bias correction differs from the host-side one by rounding that training amplifies,
    a property of the optimizer that the GPU tests measure separately)."""
    if not torch.cuda.is_available():
        return
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    benchmark = type(torch.backends.cudnn).__dict__.get("benchmark")
    if hasattr(benchmark, "setter"):
        benchmark.setter = lambda value: None
    init = torch.optim.Optimizer.__init__

    def capturable_init(self, params, defaults):
        init(self, params, defaults)
        for group in self.param_groups:
            if group.get("capturable") is False and any(p.is_cuda for p in group["params"]):
                group["capturable"] = True

    torch.optim.Optimizer.__init__ = capturable_init


def _load(name: str):
    """A module beside this file (forcing.py, timing.py), by path: the child imports nothing through the graphify package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"_graphify_{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prepare(torch, created_log: str) -> None:
    """What both versions run with: the same seeds and arithmetic, and what the run records."""
    _seed(torch)
    _same_arithmetic(torch)
    _record_autocast(torch)
    _count_captures(torch)
    _record_fallbacks()
    _record_created(torch, created_log)


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT


def _record_created(torch, log_path: str) -> None:
    """Write down, one path a line, each file or folder under the script's folder that the run writes:
    opened for writing, made, renamed to, or saved by `torch.save` (which writes from C++). The runner
    moves only these out of the user's folder after the run, never a file someone else made meanwhile;
    files written by native code other than torch.save are not seen, and stay."""
    root = os.getcwd() + os.sep
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def note(path) -> None:
        path = os.path.abspath(os.fsdecode(path))
        if path.startswith(root):
            os.write(log, (path + "\n").encode("utf-8", "surrogateescape"))

    def hook(event: str, args: tuple) -> None:
        try:
            if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
                mode, flags = args[1], args[2]
                if (mode is not None and any(c in mode for c in "wax+")) or (mode is None and flags & _WRITE_FLAGS):
                    note(args[0])
            elif event == "os.mkdir":
                note(args[0])
            elif event == "os.rename":
                note(args[1])
        except Exception:  # a path it cannot read: not the run's to lose
            pass

    sys.addaudithook(hook)
    save = torch.save

    def saved(obj, f, *args, **kwargs):
        if isinstance(f, (str, bytes, os.PathLike)):
            note(f)
        return save(obj, f, *args, **kwargs)

    torch.save = saved


def _time_split(torch, started: float | None):
    """Where the run's time goes (timing.py), from the process start: the wrappers go on now."""
    timing = _load("timing")
    now = time.perf_counter()
    origin = now - max(0.0, time.time() - started) if started else _IMPORTED
    split = timing.TimeSplit(min(origin, now))
    timing.install(torch, split)
    return split


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m graphify.verify.child")
    parser.add_argument("script")
    parser.add_argument("out")
    parser.add_argument("steps", type=int)
    parser.add_argument("--as", dest="as_path")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--states-out")
    parser.add_argument("--states-in")
    parser.add_argument("--until-reentry", type=int)
    parser.add_argument("--time-split", action="store_true")
    parser.add_argument("--started", type=float)  # time.time() when the runner started this process
    ns = parser.parse_args(argv[:split])
    script_args = argv[split + 1 :]
    as_path = os.path.abspath(ns.as_path or ns.script)
    sys.path[0] = os.path.dirname(as_path)  # before anything imports: the script's siblings come first

    import torch

    with open(ns.script, encoding="utf-8") as f:
        code = compile(f.read(), ns.script, "exec")
    progress_fd = os.open(ns.out[:-5] + ".progress", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    forcing = None
    if ns.states_out or ns.states_in:
        forcing = _load("forcing").Forcing(torch, "record" if ns.states_out else "force", ns.states_out or ns.states_in)
    recorder = Recorder(torch, ns.steps, ns.out, ns.profile, progress_fd, forcing, ns.until_reentry)
    builtins.__graphify_probe__ = recorder
    sys.argv = [as_path] + script_args
    module = types.ModuleType("__main__")
    module.__file__ = as_path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    _prepare(torch, ns.out[:-5] + ".written")
    if ns.time_split:  # after the recorder kept the unwrapped synchronize
        recorder.split = _time_split(torch, ns.started)
    global _cuda_seen
    _cuda_seen = torch.cuda.is_available()
    code_ = 0
    try:
        try:
            exec(code, module.__dict__)
            ended = "script-ended"
        except StopScript:
            ended = "steps"
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
            ended = "script-ended"
        recorder.finish(ended)
    except SystemExit as exc:
        code_ = exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException as exc:  # the script's traceback, without this module's frame
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next or exc.__traceback__)
        code_ = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code_)  # threads the script left running (loggers, loader workers) must not keep it alive


if __name__ == "__main__":
    main()
