"""`graphify verify`'s time split (graphify/verify/timing.py): where each run's time goes, each instant
counted once, and what capture can win of it. On the CPU: the bookkeeping on a scripted clock, the
wrappers on real torch calls made slow on purpose, the marks instrumentation adds, the verdict and the
report; one slow test runs verify on a script whose loader sleeps."""

import json
import textwrap
import time

import pytest
import torch
from click.testing import CliRunner
from rich.console import Console

from graphify.cli import cli
from graphify.verify import timing, verify_file
from graphify.verify.display import render
from graphify.verify.instrument import instrument, timing_marks
from graphify.verify.report import PASSED, VerifyReport
from graphify.verify.runner import RunResult
from graphify.verify.timing import DATA, EVALUATION, H2D, HOST_READ, REST, STARTUP, STEP, TimeSplit


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def at(self, t: float) -> float:
        self.now = t
        return t


def parts_sum(summary: dict) -> float:
    return sum(summary["seconds"].values())


# ---- the bookkeeping ------------------------------------------------------------------------------


def test_each_instant_counts_once_and_the_parts_sum_to_the_whole_run():
    clock = Clock()
    split = TimeSplit(origin=0.0, clock=clock)
    split.enter(clock.at(2.0))  # start-up: 2 s
    split.call(DATA, 2.0, 2.5)  # iteration 1: 0.5 s data, 0.1 s copy, a host read in the step
    split.call(H2D, 2.5, 2.6)
    split.call(HOST_READ, 2.8, 2.9)
    split.step_end(clock.at(3.0))  # step: 3.0 - 2.6 = 0.4 s, of which 0.1 s a host read
    split.resume(clock.at(3.5))  # verify's own work at the probe: left out
    split.call(DATA, 3.5, 3.7)  # iteration 2, with an evaluation loop inside it
    split.other(40, clock.at(3.8))
    split.call(DATA, 3.85, 3.9)  # not timed while evaluating (the wrappers are off): evaluation
    split.other(41, clock.at(3.9))  # a loop inside it: still the one evaluation
    split.other_end(41, clock.at(4.0))
    split.other_end(40, clock.at(4.3))
    split.step_end(clock.at(4.5))  # step: 0.1 + 0.2 = 0.3 s
    split.resume(clock.at(4.6))
    split.call(HOST_READ, 4.6, 4.8)  # after the loop, before it is entered again: host reads and rest
    split.enter(clock.at(5.0))
    split.step_end(clock.at(5.5))
    split.stop(clock.at(9.0))  # stopped while paused: the window ends at the last probe
    s = split.summary()
    assert s["seconds"] == pytest.approx(
        {STARTUP: 2.0, DATA: 0.7, H2D: 0.1, STEP: 0.4 + 0.3 + 0.5, HOST_READ: 0.2, EVALUATION: 0.5, REST: 0.2}
    )
    assert s["host_reads_in_step_s"] == pytest.approx(0.1)
    assert s["excluded_s"] == pytest.approx(0.6)
    assert s["steps"] == 3
    assert s["whole_s"] == pytest.approx(5.5 - 0.6)
    assert parts_sum(s) == pytest.approx(s["whole_s"])


def test_a_script_that_ends_on_its_own_ends_the_window_there_and_an_open_loop_is_closed():
    clock = Clock()
    split = TimeSplit(origin=0.0, clock=clock)
    split.enter(clock.at(1.0))
    split.step_end(clock.at(1.5))
    split.resume(clock.at(1.5))
    split.other(7, clock.at(2.0))  # a final evaluation loop left by `return` (no other_end)
    split.stop(clock.at(3.0))
    s = split.summary()
    assert s["seconds"][EVALUATION] == pytest.approx(1.0) and s["seconds"][REST] == pytest.approx(0.5)
    assert parts_sum(s) == pytest.approx(s["whole_s"]) == pytest.approx(3.0)


def test_profiled_steps_stay_out_and_a_call_spanning_a_change_is_not_split():
    clock = Clock()
    split = TimeSplit(origin=0.0, clock=clock)
    split.enter(clock.at(1.0))
    split.step_end(clock.at(2.0))  # the profiler starts here: no resume until it stops
    split.step_end(clock.at(3.0))  # a profiled step: ignored
    split.enter(clock.at(3.2))  # ignored while paused
    split.resume(clock.at(4.0))
    split.call(DATA, 3.9, 4.1)  # began before the stretch: stays in it
    split.step_end(clock.at(4.5))
    split.stop(clock.at(4.5))
    s = split.summary()
    assert s["steps"] == 2 and s["seconds"][DATA] == 0.0
    assert s["excluded_s"] == pytest.approx(2.0)
    assert parts_sum(s) == pytest.approx(s["whole_s"]) == pytest.approx(2.5)


# ---- the wrappers, on real torch calls --------------------------------------------------------------


class SleepyData(torch.utils.data.Dataset):
    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return torch.full((2,), float(i))


def run_loop(split, batches, step_seconds=0.0, after=lambda: None):
    """The probed loop as the child runs it: entry, iterations ended by probes, verify's work at each."""
    split.enter(time.perf_counter())
    seen = []
    for x in batches:
        seen.append(x)
        time.sleep(step_seconds)
        split.step_end(time.perf_counter())
        split.resume(time.perf_counter())
    after()
    split.enter(time.perf_counter())  # entered again: what ran since the last probe was outside the loop
    split.stop(time.perf_counter())
    return seen


def installed(on_device=None):
    split = TimeSplit(time.perf_counter())
    return split, timing.install(torch, split, on_device)


def test_a_loader_that_sleeps_shows_as_data_wait():
    split, uninstall = installed()
    try:
        loader = torch.utils.data.DataLoader(SleepyData(4, 0.03), batch_size=1)
        seen = run_loop(split, loader, step_seconds=0.005)
    finally:
        uninstall()
    s = split.summary()
    assert [float(b[0, 0]) for b in seen] == [0.0, 1.0, 2.0, 3.0]
    assert s["seconds"][DATA] >= 4 * 0.03
    assert 4 * 0.005 <= s["seconds"][STEP] < s["seconds"][DATA]
    assert parts_sum(s) == pytest.approx(s["whole_s"], rel=1e-9)
    assert timing.verdict(s).startswith("data-bound: ")


def test_the_probed_loops_own_iterable_is_timed_and_yields_the_same_items():
    """`for x in __graphify_probe__.data(batches())`: a generator that sleeps before each batch."""

    def batches():
        for i in range(3):
            time.sleep(0.03)
            yield i

    split = TimeSplit(time.perf_counter())
    seen = run_loop(split, split.iterate(batches()))
    assert seen == [0, 1, 2]
    assert split.summary()["seconds"][DATA] >= 3 * 0.03


def test_a_slow_item_is_a_host_read_outside_the_step_and_step_time_inside_it(monkeypatch):
    """`.item()` waits for the GPU: here a replacement that sleeps, on tensors taken to be on the GPU."""
    item = torch.Tensor.item

    def slow_item(self):
        time.sleep(0.05)
        return item(self)

    monkeypatch.setattr(torch.Tensor, "item", slow_item)
    split, uninstall = installed(on_device=lambda t: True)
    try:
        loss = torch.tensor(2.5)
        values = []
        run_loop(split, [1, 2], after=lambda: values.append(loss.item()))  # an epoch-end read
        inside = [loss.item()]  # after the window: not counted
    finally:
        uninstall()
    assert torch.Tensor.item is slow_item  # taken off again
    assert values == inside == [2.5]
    s = split.summary()
    assert s["seconds"][HOST_READ] >= 0.05 and s["host_reads_in_step_s"] == 0.0

    split, uninstall = installed(on_device=lambda t: True)
    try:
        split.enter(time.perf_counter())
        for _ in range(2):
            loss.item()  # a read inside the step waits for the step's own kernels: step
            split.step_end(time.perf_counter())
            split.resume(time.perf_counter())
        split.stop(time.perf_counter())
    finally:
        uninstall()
    s = split.summary()
    assert s["seconds"][HOST_READ] == 0.0
    assert s["host_reads_in_step_s"] >= 2 * 0.05 and s["seconds"][STEP] >= s["host_reads_in_step_s"]


def test_copies_to_the_device_and_back_are_told_apart_and_results_are_unchanged():
    """On the CPU no tensor is on a GPU: `on_device` says which are, here the float64 ones."""
    split, uninstall = installed(on_device=lambda t: t.dtype == torch.float64)
    try:
        split.enter(time.perf_counter())
        x = torch.arange(4.0)
        up = x.to(torch.float64)  # "host to device"
        down = up.to(torch.float32)  # "device to host": a host read
        buffer = torch.zeros(4, dtype=torch.float64)
        buffer.copy_(x)  # into a "device" buffer
        same = x.to(torch.float32)  # no device change: not a part of its own
        split.stop(time.perf_counter())
    finally:
        uninstall()
    assert up.tolist() == down.tolist() == buffer.tolist() == same.tolist() == [0.0, 1.0, 2.0, 3.0]
    s = split.summary()
    assert s["seconds"][H2D] > 0 and s["seconds"][HOST_READ] > 0
    assert torch.Tensor.to is torch._C.TensorBase.to and "copy_" not in vars(torch.Tensor)


def test_other_threads_and_torch_compile_pass_straight_through():
    import threading

    split, uninstall = installed(on_device=lambda t: True)
    compiles = []

    def backend(gm, inputs):
        compiles.append(gm)
        return gm.forward

    @torch.compile(backend=backend)
    def f(x):
        return x.to(torch.float64).sum()

    try:
        split.enter(time.perf_counter())
        thread = threading.Thread(target=lambda: [torch.ones(1).item() for _ in range(1000)])
        thread.start()
        thread.join()
        assert split.summary()["seconds"][HOST_READ] == 0.0 and split.reads_in_step == 0.0
        # the compiled function: one compilation, whatever the wrappers' state
        assert float(f(torch.ones(3))) == 3.0
        split.other(1, time.perf_counter())
        assert float(f(torch.ones(3))) == 3.0
    finally:
        uninstall()
        torch._dynamo.reset()
    assert len(compiles) == 1


# ---- the verdict and the report ------------------------------------------------------------------


def summary(**seconds):
    parts = dict.fromkeys(timing.PARTS, 0.0) | seconds
    return {"whole_s": sum(parts.values()), "seconds": parts, "host_reads_in_step_s": 0.0, "steps": 10, "excluded_s": 0.0}


def test_verdict_names_what_bounds_the_run_and_the_most_capture_saves():
    data_bound = summary(startup=5.0, data_wait=7.0, step=3.0)
    assert timing.verdict(data_bound) == (
        "data-bound: 70% of the run after start-up waits for the data loader; capture saves at most 30% (the step's share)"
    )
    launch_bound = summary(startup=5.0, data_wait=0.5, h2d_copies=0.5, step=9.0)
    assert timing.verdict(launch_bound, gpu_busy=0.2) == (
        "launch-bound: 90% of the run after start-up is the step, where the GPU runs kernels only 20% of the time;"
        " capture saves at most 90% (the step's share)"
    )
    assert timing.verdict(launch_bound, gpu_busy=0.95).startswith("GPU-bound: 90% of the run after start-up is the step")
    assert timing.verdict(launch_bound).startswith("step-bound: 90%")
    assert timing.verdict(summary(step=1.0, evaluation=3.0)).startswith("evaluation-bound: 75%")
    assert timing.verdict(summary(step=1.0, host_reads=3.0)).startswith("sync-bound: 75%")
    assert timing.verdict(summary(step=1.0, h2d_copies=3.0)).startswith("copy-bound: 75%")
    assert timing.verdict(summary(startup=3.0)) is None  # nothing ran after start-up


def report_with(original_split, rewrite_split, on_cuda=True, busy=0.3):
    report = VerifyReport("train.py", 50, exit_code=PASSED, message="the rewrite is equivalent")
    report.loop = {"line": 3, "kind": "train", "function": None, "step_function": "train_step", "records_values": True}
    common = {"times": [0.0, 1.0], "on_cuda": on_cuda, "device": "GPU", "graphs": 1, "profile": {"gpu_busy_share": busy}}
    report.original = RunResult("original", 0, data=dict(common, time_split=original_split))
    report.rewrite = RunResult("rewrite", 0, data=dict(common, time_split=rewrite_split))
    return report


def test_the_json_report_carries_each_runs_split_and_the_verdict():
    report = report_with(summary(startup=5.0, data_wait=7.0, step=3.0), summary(startup=5.0, data_wait=7.0, step=1.0))
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["schema_version"] == 2
    assert doc["runs"]["original"]["time_split"]["seconds"]["data_wait"] == 7.0
    assert doc["runs"]["rewrite"]["time_split"]["seconds"]["step"] == 1.0
    assert doc["time_verdict"].startswith("data-bound: 70% of the run after start-up waits for the data loader")
    assert report_with(None, None).to_dict()["time_verdict"] is None  # --no-time-split
    cpu = report_with(summary(step=1.0), summary(step=1.0), on_cuda=False).time_verdict
    assert cpu.startswith("on the CPU, where nothing is captured: step-bound: 100%")


def test_the_text_report_shows_both_runs_parts():
    report = report_with(summary(startup=5.0, data_wait=7.0, step=3.0), summary(startup=4.0, data_wait=7.0, step=1.0))
    console = Console(record=True, width=200)
    render(report, console)
    text = console.export_text()
    assert "where the time goes (% of the run after start-up" in text
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]] for line in text.splitlines() if line.count("│") == 4}
    assert rows["data wait"] == ["7.00 s  70%", "7.00 s  88%"]
    assert rows["step"] == ["3.00 s  30%", "1.00 s  12%"]
    assert rows["start-up (% of the whole run)"] == ["5.00 s  33%", "4.00 s  33%"]
    assert rows["whole run"][0].startswith("15.00 s")
    assert "where the time goes: data-bound: 70% of the run after start-up waits for the data loader" in text
    assert text.rstrip().endswith("after start-up the original took 10 s, the rewrite 8 s\nPASSED: the rewrite is equivalent")


# ---- the marks instrumentation adds ----------------------------------------------------------------

MARKED = """\
import torch
import torch.nn as nn
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train = [(torch.randn(2, 4), torch.randn(2, 1))] * 3
val = train


def evaluate():
    total = 0.0
    with torch.no_grad():
        for x, y in val:
            total += ((model(x) - y) ** 2).mean().item()
    return total


for epoch in range(2):
    for x, y in train:
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
    print(evaluate())
"""


def stripped(code):
    return [line.strip() for line in code.splitlines()]


def test_marks_go_around_the_other_loops_and_onto_the_probed_loops_iterable():
    inst = instrument(MARKED, "t.py")
    assert [line for _, _, line in inst.other_loops] == [12]
    original, rewritten = timing_marks(inst.original, inst.rewritten, inst.other_loops)
    for code in (original, rewritten):
        lines = stripped(code)
        start = lines.index("__graphify_probe__.other(12)")
        assert lines[start + 1] == "for x, y in val:" and "__graphify_probe__.other_end(12)" in lines[start + 2 :]
        assert "for x, y in __graphify_probe__.data(train):" in lines
    # the marks are the only change
    unmarked = [line.replace("__graphify_probe__.data(train)", "train") for line in stripped(original)]
    assert [line for line in unmarked if not line.startswith("__graphify_probe__.other")] == stripped(inst.original)


def test_a_loop_not_found_alike_in_both_versions_is_marked_in_neither():
    inst = instrument(MARKED, "t.py")
    edited = inst.rewritten.replace("for x, y in val:", "for x, y in list(val):")
    original, rewritten = timing_marks(inst.original, edited, inst.other_loops)
    assert ".other(" not in original and ".other(" not in rewritten
    assert timing_marks(inst.original, "def broken(:\n", inst.other_loops) == (inst.original, "def broken(:\n")


# ---- a real run (CPU) ---------------------------------------------------------------------------------

SLEEPY = """\
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        time.sleep(0.02)
        return torch.full((4,), float(i)), torch.ones(1)


def evaluate(model, loader):
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += nn.functional.mse_loss(model(x), y).item()
    return total


torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Slow(), batch_size=2, drop_last=True)
for epoch in range(3):
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    print(evaluate(model, loader))
"""


@pytest.mark.slow
def test_verify_splits_a_data_bound_scripts_time(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SLEEPY))
    report = verify_file(str(path), steps=12, profile=False)
    assert report.passed, (report.message, report.detail)
    for run in (report.original, report.rewrite):
        s = run.data["time_split"]
        assert parts_sum(s) == pytest.approx(s["whole_s"], rel=1e-6)
        assert s["seconds"][DATA] >= 10 * 2 * 0.02  # the probed loop's batches, after its first step (start-up)
        assert s["seconds"][EVALUATION] >= 6 * 2 * 0.02  # an evaluation after epoch 1 (the run stops in epoch 2)
        assert s["seconds"][DATA] > 2 * s["seconds"][STEP]
    assert report.time_verdict.startswith("on the CPU, where nothing is captured: ")
    assert report.original.data["time_split"]["steps"] == 12
    result = CliRunner().invoke(cli, ["verify", str(path), "--steps", "4", "--json", "--no-time-split", "--no-profile"])
    doc = json.loads(result.stdout)
    assert doc["runs"]["original"]["time_split"] is None and doc["time_verdict"] is None


def test_copies_from_pageable_memory_are_counted_apart_and_named_when_they_weigh():
    clock = Clock()
    split = TimeSplit(origin=0.0, clock=clock)
    split.enter(clock.at(1.0))
    split.call(timing.PAGEABLE_H2D, 1.0, 1.3)  # an unpinned batch's copy
    split.call(H2D, 1.3, 1.4)  # a pinned one
    split.step_end(clock.at(2.0))
    s = split.summary()
    assert s["seconds"][H2D] == pytest.approx(0.4) and s["h2d_pageable_s"] == pytest.approx(0.3)
    assert "30% of it copies batches from pageable memory" in timing.verdict(s)
    s["h2d_pageable_s"] = 0.04  # under 5% of the run after start-up: not worth a word
    assert "pageable" not in timing.verdict(s)
    assert "pageable" not in timing.verdict(summary(step=1.0, h2d_copies=3.0))  # an older child's split


def test_the_wrappers_tell_a_pinned_source_from_a_pageable_one(monkeypatch):
    """On the CPU nothing is pinned: every "upload" is from pageable memory until `is_pinned` says otherwise."""
    split, uninstall = installed(on_device=lambda t: t.dtype == torch.float64)
    try:
        split.enter(time.perf_counter())
        torch.arange(4.0).to(torch.float64)
        pageable = split.pageable
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)
        torch.arange(4.0).to(torch.float64)
        split.stop(time.perf_counter())
    finally:
        uninstall()
    assert pageable > 0 and split.pageable == pageable and split.summary()["seconds"][H2D] > pageable
