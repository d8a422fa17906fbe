"""Pieces of `graphify verify` that need no subprocess: instrumentation, comparison, the report."""

import math
import textwrap

import pytest
import torch

from graphify.verify.compare import compare_values, tolerances
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
    assert probe_line(r.original) == "__graphify_probe__(loss.item(), (optimizer,))"
    lines = [l.strip() for l in r.original.splitlines()]
    assert lines.index("__graphify_probe__(loss.item(), (optimizer,))") == lines.index("optimizer.step()") + 1
    assert probe_line(r.rewritten) == "__graphify_probe__(loss.item(), (optimizer,))"
    assert probe_follows_call(r.rewritten, r.step_name)
    assert (r.kind, r.step_name, r.records_values) == ("train", "train_step", True)


def test_probe_hands_over_the_state_the_next_step_reads_again():
    """An RNN's hidden state goes from one step into the next: the probe passes it, so teacher forcing
    loads it with the parameters (else rounding differences in it compound from step to step)."""
    r = inst("""\
        rnn = nn.GRU(4, 8, batch_first=True)
        opt = torch.optim.SGD(rnn.parameters(), lr=0.1)
        h = torch.zeros(1, 2, 8)
        for x, y in loader:
            h = h.detach()
            out, h = rnn(x.unsqueeze(1), h)
            loss = out.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """)
    assert probe_line(r.original) == "__graphify_probe__(loss.item(), (opt,), (h,))"
    assert probe_line(r.rewritten) == "__graphify_probe__(loss.item(), (opt,), (h,))"
    assert probe_follows_call(r.rewritten, r.step_name)


def test_a_partial_capture_taken_on_some_steps_is_probed_inside_its_if():
    """cleanrl's DQN learns only after `learning_starts` steps: a probe after the `if` would read a loss
    no iteration has bound yet (NameError in the original) and record steps that did not happen."""
    r = inst("""\
        for step, (x, y) in enumerate(loader):
            if step >= 1:
                if step % 1 == 0:
                    optimizer.zero_grad()
                    loss = ((model(x) - y) ** 2).mean()
                    loss.backward()
                    optimizer.step()
                print(step)
        """)
    assert "graphed_model" in r.rewritten
    for code in (r.original, r.rewritten):
        lines = code.splitlines()
        at = next(i for i, line in enumerate(lines) if "__graphify_probe__(" in line)
        assert lines[at - 1] == "            optimizer.step()" and lines[at] == "            __graphify_probe__(loss.item(), (optimizer,))"


def test_a_whole_step_keyed_by_its_if_is_probed_after_the_replay():
    r = inst("""\
        for step, (x, y) in enumerate(loader):
            if step % 2 == 0:
                optimizer.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                optimizer.step()
            print(step)
        """)
    assert "CapturedStep(train_step)" in r.rewritten and probe_follows_call(r.rewritten, r.step_name)
    # reading `loss` after the step would refuse the whole step (bound on even steps only): state alone
    assert probe_line(r.original) == "__graphify_probe__(None, (optimizer,))" and not r.records_values


def test_partial_capture_is_probed_without_carried_state():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fixtures/check/sgd_onecycle_per_step.py"
    r = instrument(path.read_text(), str(path))
    assert r.kind == "train" and probe_line(r.original).startswith("__graphify_probe__(loss.item(), ")
    assert probe_line(r.original) == "__graphify_probe__(loss.item(), (optimizer,))"  # no carried state after the optimizers


def test_forcing_loads_carried_state_in_place(tmp_path):
    from graphify.verify import forcing

    model, opt = _training()
    hidden = (torch.randn(3), [torch.randn(2)])
    record = forcing.Forcing(torch, "record", str(tmp_path))
    record.after_step(1, [opt], hidden)
    saved = [t.clone() for t in forcing._leaves(hidden)]
    live = (torch.zeros(3), [torch.zeros(2)])
    pointers = [t.data_ptr() for t in forcing._leaves(live)]
    forcing.Forcing(torch, "force", str(tmp_path)).after_step(1, [opt], live)
    assert [t.data_ptr() for t in forcing._leaves(live)] == pointers
    assert all(torch.equal(a, b) for a, b in zip(forcing._leaves(live), saved))


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
    assert probe_line(r.original) == "__graphify_probe__(loss.item(), (optimizer,))"


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


def test_default_tolerances_by_precision():
    assert tolerances(False, "bfloat16", None, None) == (0.0, 0.0, 0.0)  # the CPU runs the same eager code
    assert tolerances(True, "float32", None, None) == (1e-5, 1e-7, 1e-3)
    assert tolerances(True, "bfloat16", None, None) == (1e-2, 1e-6, 5e-2)
    assert tolerances(True, "float32", 1e-2, None) == (1e-2, 1e-7, 1e-2)


def test_precision_is_the_narrowest():
    from graphify.verify import child

    assert child._precision(torch, {"a": torch.zeros(1), "b": torch.zeros(1, dtype=torch.float64)}) == "float32"
    assert child._precision(torch, {"a": torch.zeros(1, dtype=torch.float16), "b": torch.zeros(1, dtype=torch.bfloat16)}) == "bfloat16"
    assert child._precision(torch, {"step": torch.zeros(1, dtype=torch.int64)}) == "float32"


def _training():
    import random

    random.seed(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.3), torch.nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, opt


def _step(model, opt):
    import random

    x = torch.randn(8, 3) * (1 + random.random())
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def test_forcing_loads_the_whole_state_in_place_and_measures_one_step(tmp_path):
    """Parameters, buffers, optimizer state and every RNG come back exactly; the live tensors keep their
    storage (a captured graph keeps reading them); a one-step difference is measured against the step's update."""
    import random

    from graphify.verify import forcing

    model, opt = _training()
    modules = forcing._owning_modules(torch, [opt])
    assert [type(m).__name__ for m in modules] == ["BatchNorm1d"]
    random.seed(1)
    _step(model, opt)
    before = forcing.snapshot(torch, [opt], modules)
    expected_loss = _step(model, opt)
    after = forcing.snapshot(torch, [opt], modules)
    for _ in range(3):  # wander off: other parameters, statistics, moments, RNG
        _step(model, opt)
    pointers = [p.data_ptr() for p in model.parameters()]
    forcing.restore(torch, [opt], modules, before)
    assert [p.data_ptr() for p in model.parameters()] == pointers
    assert _step(model, opt) == expected_loss  # same state, same RNG draws: the same step, bit for bit
    again = forcing.snapshot(torch, [opt], modules)
    assert forcing.differences(torch, again, after, before) == {
        "params": 0.0,
        "params_abs": 0.0,
        "optim": 0.0,
        "optim_abs": 0.0,
        "buffers": 0.0,
        "buffers_abs": 0.0,
    }
    with torch.no_grad():
        model[0].weight.add_(1e-3)
    off = forcing.differences(torch, forcing.snapshot(torch, [opt], modules), after, before)
    update = torch.linalg.vector_norm(torch.cat([(a - b).flatten().double() for a, b in zip(after["params"], before["params"])]))
    assert math.isclose(off["params"], (1e-3 * 12**0.5) / float(update), rel_tol=1e-3)


def test_record_then_force_compares_each_step_from_the_originals_state(tmp_path):
    from graphify.verify import forcing

    model, opt = _training()
    record = forcing.Forcing(torch, "record", str(tmp_path))
    losses = []
    for k in range(1, 6):
        losses.append(_step(model, opt))
        record.after_step(k, [opt])
    model, opt = _training()
    force = forcing.Forcing(torch, "force", str(tmp_path))
    forced_losses = []
    for k in range(1, 6):
        forced_losses.append(_step(model, opt))
        if k == 3:  # a wrong step: the next comparison must see it, the one after must not (forced again)
            with torch.no_grad():
                model[0].bias.add_(1.0)
        force.after_step(k, [opt])
    assert force.forced == [2, 3, 4, 5, 6] and forced_losses == losses
    assert sorted(force.metrics) == [2, 3, 4, 5]
    assert force.metrics[3]["params"] > 1 and force.metrics[2]["params"] == force.metrics[4]["params"] == 0.0


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
        r.original = RunResult(
            "original", 0, data={"on_cuda": True, "times": [0.002 * k for k in range(20)], "profile": dict(eager, gpu_busy_share=busy)}
        )
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


def test_a_step_the_runtime_left_eager_is_reported_as_such():
    """A failed capture leaves the step eager with a warning: the verdict gives that reason, not unstable shapes."""
    from graphify.verify.report import VerifyReport, speed_verdict
    from graphify.verify.runner import RunResult

    r = VerifyReport("train.py", 20)
    r.original = RunResult("original", 0, data={"on_cuda": True, "times": [0.003 * k for k in range(20)]})
    warning = "graphify: `train_step` runs eagerly: capture failed (CallOperationError: einx)"
    r.rewrite = RunResult(
        "rewrite",
        0,
        data={"graphs": 0, "fallbacks": [warning], "times": [0.003 * k for k in range(20)], "profile": {"graph_launches_per_step": 0}},
    )
    assert speed_verdict(r) == (
        "the runtime ran `train_step` eagerly (capture failed (CallOperationError: einx)), so it cannot be faster where it did"
    )


def test_a_model_the_runtime_left_eager_is_reported_with_its_numbers():
    """A partial rewrite whose replays would be slower than eager: the verdict names the model and keeps
    the whole reason, measured numbers included."""
    from graphify.runtime.graphed_module import slower_replays
    from graphify.verify.report import VerifyReport, speed_verdict
    from graphify.verify.runner import RunResult

    why = slower_replays(0.31, 0.42)
    r = VerifyReport("train.py", 20)
    r.original = RunResult("original", 0, data={"on_cuda": True, "times": [0.003 * k for k in range(20)]})
    r.rewrite = RunResult(
        "rewrite", 0, data={"graphs": 2, "fallbacks": [f"graphify: the model runs eagerly: {why}"], "times": [0.003 * k for k in range(20)]}
    )
    assert speed_verdict(r) == f"the runtime ran the model eagerly ({why}), so it cannot be faster where it did"
    assert "0.42 ms" in why and "0.31 ms" in why


def test_the_child_records_fallback_warnings(monkeypatch):
    import warnings

    from graphify.runtime import GraphifyFallbackWarning
    from graphify.verify import child

    monkeypatch.setattr(child, "_FALLBACKS", [])
    monkeypatch.setattr(warnings, "showwarning", lambda *a, **k: None)
    child._record_fallbacks()
    warnings.warn("graphify: `step` runs eagerly: capture failed", GraphifyFallbackWarning, stacklevel=1)
    warnings.warn("something else", UserWarning, stacklevel=1)
    assert child._FALLBACKS == ["graphify: `step` runs eagerly: capture failed"]


def test_a_step_run_by_a_called_function_is_probed_without_looking_delegated():
    """`loss = train(model, optimizer, ...)` per epoch: the probe takes the loss and the optimizers, which
    must not read as a step handed to code out of sight (GFY707), or verify finds nothing to verify."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fixtures/traps/full_batch_mode_calls_per_epoch.py"
    r = instrument(path.read_text(), str(path))
    assert probe_line(r.original) == "__graphify_probe__(loss, (optimizer,))" and r.step_name == "train_step"


def test_only_what_the_run_wrote_leaves_the_users_folder(tmp_path):
    """Files new in the script's folder after a run move into verify's own folder only if the run wrote
    them (the child writes their paths down): a file the user saved there meanwhile stays."""
    from graphify.verify.runner import _files_under, _move_created

    folder, into = tmp_path / "project", tmp_path / "verify"
    folder.mkdir()
    (folder / "train.py").write_text("")
    before = _files_under(str(folder))
    (folder / "checkpoint.pt").write_text("the run's")
    (folder / "notes.md").write_text("the user's")
    (folder / "runs").mkdir()
    (folder / "runs" / "events.log").write_text("the run's")
    written = {str((folder / "checkpoint.pt").resolve()), str((folder / "runs" / "events.log").resolve())}
    _move_created(str(folder), before, str(into), written)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.md", "train.py"]
    assert (into / "checkpoint.pt").read_text() == "the run's" and (into / "runs" / "events.log").exists()


def test_the_child_writes_down_what_the_script_writes(tmp_path):
    """In a process of its own: the audit hook stays for the life of the process."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import torch
        from graphify.verify import child
        child._record_created(torch, "run.created")
        with open("log.txt", "w") as f:
            f.write("x")
        open("log.txt").read()  # reading is no writing
        import os
        os.mkdir("ckpt")
        torch.save({"a": 1}, "ckpt/model.pt")
        """
    )
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)
    written = set((tmp_path / "run.created").read_text().splitlines())
    root = tmp_path.resolve()
    assert written == {str(root / "log.txt"), str(root / "ckpt"), str(root / "ckpt" / "model.pt")}


def test_a_partial_capture_whose_step_runs_in_a_helper_is_probed_after_the_call_handing_it_the_model():
    """`loss = train(model, x, y, idx, optimizer)`: the helper runs the backward and the optimizer's step,
    so the probe follows that call and reads the optimizer as the loop body names it."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fixtures/traps/model_handed_to_step_helper.py"
    r = instrument(path.read_text(), str(path))
    assert r.kind == "train" and "graphed_model" in r.rewritten
    lines = r.original.splitlines()
    at = next(i for i, line in enumerate(lines) if "__graphify_probe__(" in line and "enter()" not in line)
    assert lines[at].strip() == "__graphify_probe__(None, (optimizer,))"
    assert "loss = train(model, x, y, train_idx, optimizer)" in lines[at - 1]


def test_a_step_after_the_loop_was_entered_again_with_another_model_is_measured_without_a_crash():
    """The loop of `train(epoch, model)` called first with one model, then another: the state before the
    first step of the second model has other shapes. That step is compared with no scale from it (strictly),
    a state of another shape than the original's is as far as can be; nothing raises."""
    from graphify.verify import forcing

    def state(*tensors):
        return {"params": [{"weight": t} for t in tensors], "optim": [], "buffers": []}

    before = state(torch.zeros(784, 10))
    after = state(torch.ones(5, 5))
    assert forcing.differences(torch, state(torch.ones(5, 5)), after, before) == {"params": 0.0, "params_abs": 0.0}
    off = forcing.differences(torch, state(torch.ones(5, 5) + 1e-3), after, before)
    assert off["params"] > 1e3  # no scale from the step before: any difference counts in full
    assert forcing.differences(torch, state(torch.ones(4, 5)), after, before)["params"] == math.inf
