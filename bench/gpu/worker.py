"""The GPU benchmark's worker: builds one workload in one variant (eager, graphify's rewrite, a hand
capture, torch.compile) in a fresh process and times whole `train` calls; `run.py` starts one per
(workload, variant) and collects what each writes."""

from __future__ import annotations

import datetime as _dt
import gc
import hashlib
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.workloads import load_module_from_path, load_workload, workload_path  # noqa: E402

COMPILE_VARIANTS = ("compile-model", "compile-step", "compile-default", "graphify-compile")


class Unavailable(Exception):
    """The variant cannot be built here (e.g. graphify's rewriter is missing)."""


def short_reason(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip().splitlines()
    first = next((line.strip() for line in text if line.strip()), "")
    reason = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


def _train_args(w):
    return (w["model"], w["optimizer"], w["scheduler"], w["loss_fn"], w["batches"])


def _source_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _load_rewriter():
    """graphify's rewriter, or raise Unavailable (it may not exist yet, or libcst may be missing)."""
    try:
        from graphify.rewrite import rewrite_source
    except Exception as exc:
        raise Unavailable(f"graphify.rewrite not importable ({short_reason(exc)})") from exc
    return rewrite_source


def rewrite_workload(name: str, rewrite_source, out_dir: Path) -> tuple[Path, list[str]]:
    """Rewrite one workload with graphify; save the result and record it in the manifest."""
    path = workload_path(name)
    source = path.read_text()
    try:
        result = rewrite_source(source, str(path))
    except Exception as exc:
        raise Unavailable(f"rewrite_source raised {short_reason(exc)}") from exc
    code = getattr(result, "code", None)
    if not isinstance(code, str) or not code.strip():
        raise Unavailable(f"rewrite_source returned no code ({type(result).__name__})")
    notes = ["rewriter left the source unchanged"] if code == source else []
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / f"{name}.py"
    out_path.write_text(code)
    manifest_path = out_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest[name] = {
        "source_sha256": _source_sha256(source),
        "rewritten_sha256": _source_sha256(code),
        "unchanged": code == source,
        "graphify_sha256": _graphify_sources_sha256(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return out_path, notes


def _graphify_sources_sha256() -> str:
    """One hash over graphify's own sources: a rewrite made by another graphify is stale."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "graphify").rglob("*.py")):
        digest.update(str(path.relative_to(REPO)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def ahead_of_time_rewrite(name: str, out_dir: Path) -> tuple[Path | None, str]:
    """A rewrite saved by --rewrite-only, if it is current: (path, "") or (None, why not)."""
    manifest_path = out_dir / "manifest.json"
    out_path = out_dir / f"{name}.py"
    if not (manifest_path.exists() and out_path.exists()):
        return None, f"no --rewrite-only output for {name} in {out_dir}"
    try:
        entry = json.loads(manifest_path.read_text()).get(name) or {}
    except ValueError:
        return None, f"unreadable {manifest_path}"
    if entry.get("source_sha256") != _source_sha256(workload_path(name).read_text()):
        return None, f"--rewrite-only output for {name} is stale (workload changed); re-run it"
    if entry.get("graphify_sha256") != _graphify_sources_sha256():
        return None, f"--rewrite-only output for {name} is stale (graphify changed); re-run it"
    if entry.get("rewritten_sha256") != _source_sha256(out_path.read_text()):
        return None, f"{out_path} was edited after --rewrite-only"
    return out_path, ""


def _graphify_module(name: str, save_dir: Path):
    """Rewrite the workload's source with graphify (or take a current ahead-of-time rewrite) and import it."""
    notes: list[str] = []
    try:
        rewrite_source = _load_rewriter()
    except Unavailable as missing:
        out_path, problem = ahead_of_time_rewrite(name, save_dir)
        if out_path is None:
            raise Unavailable(f"{missing}; {problem}") from None
        notes.append("rewritten ahead of time by --rewrite-only: graphify.rewrite not importable here")
    else:
        out_path, notes = rewrite_workload(name, rewrite_source, save_dir)
    try:
        module = load_module_from_path(out_path, f"graphified_{name}")
    except Exception as exc:
        raise Unavailable(f"rewritten module does not import ({short_reason(exc)})") from exc
    if not callable(getattr(module, "train", None)):
        raise Unavailable("rewritten module has no train()")
    return module, notes


def _make_runner(module, variant: str, name: str, device, save_dir: Path):
    """Return (build, run(w, steps), notes) for one variant."""
    import torch

    notes: list[str] = []
    build = module.build
    if variant == "eager":

        def run(w, steps):
            module.train(*_train_args(w), steps)

    elif variant == "hand":
        if device.type != "cuda":
            raise Unavailable("needs CUDA")

        def run(w, steps):
            module.train_hand(*_train_args(w), steps)

    elif variant == "graphify":
        rewritten, notes = _graphify_module(name, save_dir)
        # the whole rewritten file is used: if the rewriter changed build() (e.g. optimizer flags)
        # that change is part of what it produced
        build = getattr(rewritten, "build", module.build)

        def run(w, steps):
            rewritten.train(*_train_args(w), steps)

    elif variant == "compile-model":

        def run(w, steps):
            compiled = torch.compile(w["model"], mode="reduce-overhead")
            module.train(compiled, w["optimizer"], w["scheduler"], w["loss_fn"], w["batches"], steps)

    elif variant == "compile-default":

        def run(w, steps):
            model, optimizer, scheduler, loss_fn, batches = _train_args(w)
            module.train(torch.compile(model), optimizer, scheduler, loss_fn, batches, steps)

    elif variant == "graphify-compile":
        rewritten, notes = _graphify_module(name, save_dir)
        build = getattr(rewritten, "build", module.build)

        def run(w, steps):
            model, optimizer, scheduler, loss_fn, batches = _train_args(w)
            rewritten.train(torch.compile(model), optimizer, scheduler, loss_fn, batches, steps)

    elif variant == "compile-step":

        def run(w, steps):
            model, optimizer, scheduler, loss_fn, batches = _train_args(w)
            if scheduler is not None:
                # PyTorch recipe for compiled optimizers + LR schedulers: tensor LR (no recompiles);
                # the scheduler then updates it in place.
                for group in optimizer.param_groups:
                    group["lr"] = torch.tensor(float(group["lr"]), device=device)
            autocast = bool(getattr(module, "USE_BF16", False))

            def step_fn(x, y):
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                    loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()

            step = torch.compile(step_fn, mode="reduce-overhead")
            model.train()
            for i in range(steps):
                x, y = batches[i % len(batches)]
                optimizer.zero_grad(set_to_none=True)
                step(x, y)
                if scheduler is not None:
                    scheduler.step()

    else:
        raise ValueError(f"unknown variant {variant!r}")
    return build, run, notes


def _final_loss(module, w) -> float | None:
    import torch

    try:
        model, _, _, loss_fn, batches = _train_args(w)
        x, y = batches[0]
        with torch.no_grad():
            autocast = bool(getattr(module, "USE_BF16", False))
            with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
                return float(loss_fn(model(x), y).float().item())
    except Exception:
        return None


def measure(name, variant, n1, n2, repeats, force_cpu, save_dir, compile_reset=False):
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not force_cpu else "cpu")
    cuda = device.type == "cuda"
    module = load_workload(name)
    build, run, notes = _make_runner(module, variant, name, device, save_dir)
    is_compile = variant in COMPILE_VARIANTS
    if is_compile:
        # every fresh build may recompile (new optimizer/model objects): never fall back to eager
        for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(256, getattr(torch._dynamo.config, knob)))

    def sync():
        if cuda:
            torch.cuda.synchronize()

    final_loss = [None]

    def one_call(steps: int, keep_loss: bool = False):
        gc.collect()
        if is_compile and compile_reset:
            torch._dynamo.reset()  # fresh Dynamo + CUDAGraph trees; Inductor's caches stay warm
        if cuda:
            torch.cuda.empty_cache()
        w = build(device)
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        run(w, steps)
        sync()
        elapsed = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() if cuda else None
        if keep_loss:
            final_loss[0] = _final_loss(module, w)
        del w
        return elapsed, peak

    import warnings

    with warnings.catch_warnings(record=True) as caught:  # a graph variant that ran eagerly must say so
        warnings.simplefilter("always")
        t_first, peak_first = one_call(n1)
    fallbacks = sorted({str(w.message) for w in caught if type(w.message).__name__ == "GraphifyFallbackWarning"})
    if fallbacks:
        notes = notes + [f"fell back to eager: {m}" for m in fallbacks]
    pairs = []
    peaks = [peak_first]
    for r in range(repeats):
        t1, p1 = one_call(n1)
        t2, p2 = one_call(n2, keep_loss=(r == repeats - 1))
        pairs.append((t1, t2))
        peaks += [p1, p2]
    per_step = [(t2 - t1) / (n2 - n1) for t1, t2 in pairs]
    ms = statistics.median(per_step)
    out = {
        "status": "ok",
        "ms_per_step": ms * 1e3,
        "ms_per_step_repeats": [p * 1e3 for p in per_step],
        "setup_s": t_first - n1 * ms,
        "setup_warm_s": statistics.median(t1 - n1 * ms for t1, _ in pairs),
        "peak_mem_mib": (peak_first / 2**20) if peak_first is not None else None,
        "peak_mem_mib_max": (max(peaks) / 2**20) if cuda else None,
        "first_call_s": t_first,
        "calls_s": [list(p) for p in pairs],
        "n1": n1,
        "n2": n2,
        "repeats": repeats,
        "loss_after_n2": final_loss[0],
        "notes": notes,
        "device_type": device.type,
    }
    if is_compile:
        try:
            from torch._dynamo.utils import counters

            out["dynamo_stats"] = {k: int(v) for k, v in counters["stats"].items()}
            skips = dict(counters["inductor"]).get("cudagraph_skips")
            if skips:
                out["notes"] = notes + [f"cudagraph skips: {int(skips)}"]
        except Exception:
            pass
    return out


def environment() -> dict:
    import torch

    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "device": "cpu",
        "hostname_platform": platform.platform(),
    }
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name(0)
        env["cudnn"] = torch.backends.cudnn.version()
    return env


def worker_main(args) -> int:
    result: dict = {"workload": args.worker_workload, "variant": args.worker_variant}
    try:
        result["env"] = environment()
        result.update(
            measure(
                args.worker_workload,
                args.worker_variant,
                args.worker_n1,
                args.worker_n2,
                args.repeats,
                args.cpu,
                Path(args.graphified_dir),
                args.compile_reset,
            )
        )
    except Unavailable as exc:
        result.update(status="unavailable", reason=str(exc))
    except Exception as exc:  # report, don't crash the whole benchmark
        traceback.print_exc()
        result.update(status="failed", reason=short_reason(exc))
    Path(args.result_file).write_text(json.dumps(result, indent=2))
    # skip interpreter teardown (Inductor's compile-worker pool, CUDA context): the result is saved
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
