"""Pieces of `graphify verify` that need no subprocess: instrumentation, comparison, the report."""

import math
import textwrap

import pytest
import torch

from graphify.verify.compare import compare_tensors, compare_values, tolerances
from graphify.verify.instrument import InstrumentError, instrument, probe_follows_call

HEADER = """\
import torch
import torch.nn as nn
model = nn.Linear(4, 1)
optimizer = torch.optim.Adam(model.parameters())
loader = [(torch.randn(2, 4), torch.randn(2, 1))] * 3
"""


def probe_line(code):
    lines = [l.strip() for l in code.splitlines() if "__graphify_probe__(" in l]
    assert len(lines) == 1, lines
    return lines[0]


def inst(body):
    return instrument(HEADER + textwrap.dedent(body), "t.py")


def test_probe_after_the_optimizer_step_reads_the_loss():
    r = inst("""\
        for x, y in loader:
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            print("done")
        """)
    assert probe_line(r.original) == "__graphify_probe__(loss.item(), optimizer)"
    lines = [l.strip() for l in r.original.splitlines()]
    assert lines.index("__graphify_probe__(loss.item(), optimizer)") == lines.index("optimizer.step()") + 1
    assert probe_line(r.rewritten) == "__graphify_probe__(loss.item(), optimizer)"
    assert probe_follows_call(r.rewritten, r.step_name)
    assert (r.kind, r.step_name, r.records_values) == ("train", "train_step", True)


def test_probe_reads_the_loss_inside_scaler_scale():
    r = inst("""\
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        for x, y in loader:
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        """)
    assert probe_line(r.original) == "__graphify_probe__(loss.item(), optimizer)"


def test_probe_records_every_loss_and_optimizer():
    r = inst("""\
        opt_b = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            loss_a = ((model(x) - y) ** 2).mean()
            loss_a.backward()
            optimizer.step()
            opt_b.zero_grad()
            loss_b = model(x).abs().mean()
            (loss_b / 2).backward()
            opt_b.step()
        """)
    assert probe_line(r.original) == "__graphify_probe__((loss_a.item(), (loss_b / 2).item()), (optimizer, opt_b))"


def test_inference_probe_passes_the_output():
    r = inst("""\
        with torch.no_grad():
            for x, y in loader:
                out = model(x)
                print(out.sum().item())
        """)
    assert r.kind == "inference"
    assert probe_line(r.original) == "__graphify_probe__(out, None)"


def test_nothing_to_verify():
    with pytest.raises(InstrumentError, match="nothing to verify"):
        instrument("import torch\nx = torch.ones(3)\n", "t.py")
    with pytest.raises(InstrumentError, match="syntax error"):
        instrument("for x in loader:\n    loss.backward(\n", "t.py")


def test_probe_must_follow_the_replay():
    code = "for x in xs:\n    __graphify_probe__(1, None)\n    loss = train_step(x)\n"
    assert not probe_follows_call(code, "train_step")
    assert probe_follows_call(code.replace("    __graphify_probe__(1, None)\n", "") + "    __graphify_probe__(1, None)\n", "train_step")
    assert not probe_follows_call("for x in xs:\n    loss = train_step(x)\n", "train_step")


def test_compare_values_exact_and_tolerant():
    a = [[1.0], [2.0], [float("nan")], [float("inf")]]
    assert compare_values(a, [list(v) for v in a], 0, 0).ok
    b = [[1.0], [2.0 + 1e-12], [float("nan")], [float("inf")]]
    exact = compare_values(a, b, 0, 0)
    assert not exact.ok and exact.first_bad == "step 2"
    assert compare_values(a, b, 1e-6, 0).ok
    assert not compare_values([[1.0]], [[float("nan")]], 1e-3, 1e-3).ok


def test_compare_tensors_by_norm():
    a = {"w": torch.ones(4), "b": torch.zeros(2)}
    b = {"w": torch.ones(4) * (1 + 1e-5), "b": torch.zeros(2)}
    d = compare_tensors(a, b, 1e-4, 0)
    assert d.ok and d.worst == "w" and math.isclose(d.max_rel, 1e-5, rel_tol=1e-2)
    assert not compare_tensors(a, b, 0, 0).ok
    assert not compare_tensors(a, {"w": torch.ones(4)}, 1, 1).ok  # a tensor missing
    assert not compare_tensors(a, {"w": torch.ones(2), "b": torch.zeros(2)}, 1, 1).ok  # a shape changed
    assert not compare_tensors({"b": torch.zeros(2)}, {"b": torch.full((2,), 1e-3)}, 0.5, 0).ok  # zero reference


def test_default_tolerances_by_precision():
    assert tolerances(False, "bfloat16", None, None) == (0.0, 0.0)  # the CPU runs the same eager code
    assert tolerances(True, "float32", None, None) == (1e-4, 1e-6)
    assert tolerances(True, "float16", None, None) == (1e-3, 1e-5)
    assert tolerances(True, "bfloat16", None, None) == (1e-2, 1e-5)
    assert tolerances(True, "float32", 1e-2, None) == (1e-2, 1e-6)


def test_rounding_noise_widens_the_tolerance_per_value():
    """A parameter that rounding alone moves far (noise) may differ that much, ten times over; the
    others stay held to rtol."""
    original = {"w": torch.ones(4), "key_bias": torch.full((2,), 1e-3)}
    nudged = {"w": torch.ones(4), "key_bias": torch.full((2,), 2e-3)}
    noise = compare_tensors(original, nudged, 0, 0)
    rewrite = {"w": torch.ones(4), "key_bias": torch.full((2,), -3e-3)}
    assert not compare_tensors(original, rewrite, 1e-4, 0).ok
    assert compare_tensors(original, rewrite, 1e-4, 0, noise.abs_by_name).ok
    worse = {"w": torch.ones(4), "key_bias": torch.full((2,), 5e-2)}
    assert not compare_tensors(original, worse, 1e-4, 0, noise.abs_by_name).ok
    stale = {"w": torch.ones(4) * 1.01, "key_bias": torch.full((2,), -3e-3)}
    assert compare_tensors(original, stale, 1e-4, 0, noise.abs_by_name).first_bad == "w"


def test_nudge_moves_every_parameter_by_one_ulp_and_precision_is_the_narrowest():
    from graphify.verify import child

    params = [torch.nn.Parameter(torch.tensor([1.5, -2.0, 0.0])), torch.nn.Parameter(torch.tensor([3.0], dtype=torch.float64))]
    before = [p.detach().clone() for p in params]
    child._nudge(torch, [torch.optim.SGD(params, lr=0.1)])
    for p, b in zip(params, before):
        away = torch.where(b < 0, -math.inf, math.inf)
        assert torch.equal(p.detach(), torch.nextafter(b, away))
    assert child._precision(torch, {"a": torch.zeros(1), "b": torch.zeros(1, dtype=torch.float64)}) == "float32"
    assert child._precision(torch, {"a": torch.zeros(1, dtype=torch.float16), "b": torch.zeros(1, dtype=torch.bfloat16)}) == "bfloat16"
    assert child._precision(torch, {"step": torch.zeros(1, dtype=torch.int64)}) == "float32"


def test_profile_summary_and_the_verdict_it_drives():
    """The GPU's idle share of the eager step decides the verdict (launch calls are only part of the
    host's cost per kernel)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from graphify.verify import child
    from graphify.verify.report import VerifyReport, speed_verdict
    from graphify.verify.runner import RunResult

    def event(name, device, us):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(elapsed_us=lambda: us))

    steps, window_s = 5, 0.010  # 5 steps, 2 ms each
    events = [event("cudaLaunchKernel", DeviceType.CPU, 4.0) for _ in range(100)]
    events += [event("gemm", DeviceType.CUDA, 10.0) for _ in range(100)] + [event("Memcpy HtoD", DeviceType.CUDA, 500.0)]
    eager = child._summarize(events, window_s, steps)
    assert eager["kernels_per_step"] == 20 and eager["launches_per_step"] == 20
    assert math.isclose(eager["launch_share"], 0.04) and math.isclose(eager["gpu_busy_share"], 0.15)
    graphed = child._summarize([event("cudaGraphLaunch", DeviceType.CPU, 5.0)] * steps, window_s, steps)
    assert graphed["graph_launches_per_step"] == 1

    def report(busy):
        r = VerifyReport("train.py", 20)
        r.original = RunResult("original", 0, data={"on_cuda": True, "times": [0.002 * k for k in range(20)],
                                                     "profile": dict(eager, gpu_busy_share=busy)})
        r.rewrite = RunResult("rewrite", 0, data={"graphs": 1, "times": [0.0005 * k for k in range(20)], "profile": graphed})
        return speed_verdict(r)

    assert report(0.15).startswith("host-bound: the GPU ran kernels only 15%") and "(measured 4.00x)" in report(0.15)
    assert report(0.95).startswith("GPU-bound")
    assert "moderate" in report(0.7)


def test_a_loop_that_stops_within_warmup_and_capture_is_not_timed():
    """Five steps are warmup and capture only: timing them would report the capture as the speed."""
    from graphify.verify.report import VerifyReport, speed_verdict
    from graphify.verify.runner import RunResult

    r = VerifyReport("train.py", 20)
    r.original = RunResult("original", 0, data={"on_cuda": True, "times": [0.003 * k for k in range(5)]})
    r.rewrite = RunResult("rewrite", 0, data={"graphs": 1, "times": [0.0, 0.01, 0.02, 0.03, 0.08]})
    assert r.original.step_ms is None and r.speedup is None
    assert speed_verdict(r).startswith("no timing: the loop ran too few steps")
    r.original.data["times"] = [0.003 * k for k in range(8)]
    r.rewrite.data["times"] = [0.0, 0.01, 0.02, 0.03, 0.08, 0.081, 0.082, 0.083]
    assert math.isclose(r.speedup, 3.0)
