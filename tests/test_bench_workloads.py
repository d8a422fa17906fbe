"""Smoke tests for the GPU benchmark's workloads (bench/workloads/) and driver (bench/gpu/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.workloads import (  # noqa: E402
    LARGE_WORKLOADS,
    SMALL_WORKLOADS,
    WORKLOADS,
    load_module_from_path,
    load_workload,
)

HAS_CUDA = torch.cuda.is_available()
needs_cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]


def _snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def _call(fn, w, steps):
    fn(w["model"], w["optimizer"], w["scheduler"], w["loss_fn"], w["batches"], steps)


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_interface(name):
    module = load_workload(name)
    for attr in ("build", "train", "train_hand"):
        assert callable(getattr(module, attr, None)), f"{name}.{attr} missing"
    source = Path(module.__file__).read_text()
    train_src = source.split("def train(", 1)[1].split("\ndef ", 1)[0]
    assert ".item()" not in train_src  # train() is what graphify rewrites: keep it sync-free


@pytest.mark.parametrize("name", SMALL_WORKLOADS)
def test_small_workload_builds_and_trains_on_cpu(name):
    module = load_workload(name)
    w = module.build("cpu")
    assert set(w) >= {"model", "optimizer", "scheduler", "loss_fn", "batches"}
    assert len(w["batches"]) == 8
    assert all(x.device.type == "cpu" and y.device.type == "cpu" for x, y in w["batches"])
    before = _snapshot(w["model"])
    assert module.train(w["model"], w["optimizer"], w["scheduler"], w["loss_fn"], w["batches"], 2) is None
    after = _snapshot(w["model"])
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    assert all(torch.isfinite(p).all() for p in after)


@pytest.mark.parametrize("name", SMALL_WORKLOADS)
def test_build_is_deterministic(name):
    module = load_workload(name)
    a, b = module.build("cpu"), module.build("cpu")
    for pa, pb in zip(a["model"].parameters(), b["model"].parameters()):
        assert torch.equal(pa, pb)
    for (xa, ya), (xb, yb) in zip(a["batches"], b["batches"]):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("name", LARGE_WORKLOADS)
def test_large_workload_trains(name):
    if not HAS_CUDA:
        pytest.skip("large workloads are too big for a CPU smoke test")
    module = load_workload(name)
    w = module.build("cuda")
    before = _snapshot(w["model"])
    _call(module.train, w, 2)
    torch.cuda.synchronize()
    assert any(not torch.equal(a, b) for a, b in zip(before, _snapshot(w["model"])))


@pytest.mark.parametrize("name", WORKLOADS)
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_train_hand_runs_on_cuda(name):
    module = load_workload(name)
    w = module.build("cuda")
    before = _snapshot(w["model"])
    _call(module.train_hand, w, 6)  # 3 warmup steps + capture + 3 replays
    torch.cuda.synchronize()
    after = _snapshot(w["model"])
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    assert all(torch.isfinite(p).all() for p in after)


def test_report_renders_from_synthetic_results(tmp_path):
    from bench.gpu.report import render_markdown, speedup

    def ok(ms):
        return {"status": "ok", "ms_per_step": ms, "setup_s": 0.5, "peak_mem_mib": 12.0, "loss_after_n2": 1.0}

    data = {
        "meta": {"env": {"device": "Fake GPU", "torch": "2.x"}, "date": "today", "repeats": 3},
        "results": {
            "tiny": {
                "eager": ok(1.0),
                "hand": ok(0.25),
                "graphify": {"status": "unavailable", "reason": "graphify.rewrite not importable"},
                "compile-step": {"status": "failed", "reason": "RuntimeError: boom | pipe"},
            }
        },
    }
    assert speedup(data, "tiny", "hand") == pytest.approx(4.0)
    assert speedup(data, "tiny", "graphify") is None
    md = render_markdown(data, png_name=None)
    assert "Fake GPU" in md and "4.00×" in md
    assert "unavailable: graphify.rewrite not importable" in md
    assert "boom \\| pipe" in md
    assert "## How measured" in md


@pytest.mark.slow
def test_driver_quick_cpu(tmp_path):
    out = tmp_path / "quick.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gpu" / "run.py"),
            "--quick",
            "--cpu",
            "--workloads",
            "tiny",
            "--variants",
            "eager,hand",
            "--json",
            str(out),
            "--docs-dir",
            str(tmp_path),
            "--graphified-dir",
            str(tmp_path / "graphified"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    eager = data["results"]["tiny"]["eager"]
    assert eager["status"] == "ok", eager
    # a quick CPU run is far too short to time reliably: check the bookkeeping only
    assert eager["n1"] < eager["n2"] and all(t > 0 for pair in eager["calls_s"] for t in pair)
    assert data["results"]["tiny"]["hand"]["status"] == "skipped"
    assert (tmp_path / "benchmarks.md").exists()


def test_ahead_of_time_rewrite_roundtrip(tmp_path):
    """--rewrite-only output is used only while it matches the workload source."""
    from bench.gpu import run as bench_run

    class Result:
        def __init__(self, code):
            self.code = code

    def fake_rewrite(source, path):
        assert path.endswith("tiny.py")
        return Result(source + "\nGRAPHIFIED = True\n")

    out_path, notes = bench_run.rewrite_workload("tiny", fake_rewrite, tmp_path)
    assert notes == []
    assert bench_run.ahead_of_time_rewrite("tiny", tmp_path) == (out_path, "")
    assert bench_run.ahead_of_time_rewrite("mlp", tmp_path)[0] is None
    module = load_module_from_path(out_path, "graphified_tiny_test")
    assert module.GRAPHIFIED and callable(module.train)
    out_path.write_text(out_path.read_text() + "# edited by hand\n")
    path, problem = bench_run.ahead_of_time_rewrite("tiny", tmp_path)  # tampered: not used
    assert path is None and "edited" in problem
