"""`graphify rewrite --defer-host-reads`: the statements after the replay that only read the step's results
for the host run one step later, with the values they would have read. Each script's deferred rewrite, run
on the CPU, prints what the original prints, line for line; the statements that feed the loop stay where
they are. DeferredReads itself: values held one step, handed back oldest first, copies that later changes
to the originals do not reach."""

from __future__ import annotations

import textwrap

import pytest
import torch
from click.testing import CliRunner
from in_process import printed_by

import graphify.cli as cli
from graphify.config import Settings
from graphify.rewrite import rewrite_source
from graphify.rewrite.bundle import RuntimeChoice, vendor_code
from graphify.runtime import DeferredReads

_HEAD = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = [(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(7)]
"""
_TAIL = """
print("checksum", sum(p.sum().item() for p in model.parameters()))
"""
_STEP = """
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        acc = (logits.argmax(1) == y).float().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def _deferring() -> Settings:
    settings = Settings()
    settings.defer_host_reads = True
    return settings


def _script(body: str) -> str:
    """`body` with its STEP line replaced by the training step, at that line's indentation."""
    lines = textwrap.dedent(body).splitlines(keepends=True)
    step = [
        textwrap.indent(textwrap.dedent(_STEP).lstrip("\n"), line[: len(line) - len(line.lstrip())]) if line.strip() == "STEP" else line
        for line in lines
    ]
    return _HEAD + "".join(step) + _TAIL


def _run(code: str, tmp_path) -> str:
    path = tmp_path / "script.py"
    path.write_text(code)
    return printed_by(path)


def _deferred(body: str, tmp_path, runtime=RuntimeChoice()):
    """The rewrite with --defer-host-reads, which must print what the original prints, line for line."""
    script = _script(body)
    result = rewrite_source(script, str(tmp_path / "script.py"), _deferring(), runtime)
    assert not result.errors and result.changed, [o.reasons for o in result.outcomes]
    original, rewritten = _run(script, tmp_path), _run(result.code, tmp_path)
    assert rewritten.splitlines() == original.splitlines()
    assert len(original.splitlines()) >= 2
    return result


LOOPS = {
    "print-with-step": """
    for epoch in range(2):
        for step, (x, y) in enumerate(data):
            STEP
            if step % 2 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
    """,
    "two-items": """
    for step, (x, y) in enumerate(data):
        STEP
        print(f"{step}: loss {loss.item():.6f} acc {acc.item():.4f} n {x.size(0)} {float(loss.detach()):.3f}")
    """,
    "meter": """
    class Meter:
        def __init__(self):
            self.total, self.count = 0.0, 0

        def update(self, value, n):
            self.total += value * n
            self.count += n
            print(f"meter {self.total / self.count:.6f}")

    meter = Meter()
    running = 0.0
    for step, (x, y) in enumerate(data):
        STEP
        meter.update(loss.item(), x.shape[0])
        running += loss.detach().cpu().item()
    print(f"avg {meter.total / meter.count:.6f} running {running:.6f}")
    """,
    "history": """
    history = {"loss": [], "acc": []}
    for step, (x, y) in enumerate(data):
        STEP
        history["loss"].append(loss.item())
        history["acc"].append(acc.tolist())
    print([round(v, 6) for v in history["loss"]], history["acc"])
    """,
    "break": """
    for step, (x, y) in enumerate(data):
        if step == 4:
            break
        STEP
        print(step, round(loss.item(), 6))
    print("after the loop")
    """,
    "break-after-the-replay": """
    for step, (x, y) in enumerate(data):
        STEP
        if step == 4:
            break
        print(step, round(loss.item(), 6))
    print("after the loop")
    """,
    "return": """
    def train():
        for step, (x, y) in enumerate(data):
            if step == 5:
                return step
            STEP
            print(step, round(loss.item(), 6))

    print("returned", train())
    """,
    "exception": """
    try:
        for step, (x, y) in enumerate(data):
            if step == 3:
                raise ValueError("bad batch")
            STEP
            print(step, round(loss.item(), 6))
    except ValueError as e:
        print("caught", e)
    """,
    "continue": """
    for step, (x, y) in enumerate(data):
        if step % 3 == 1:
            continue
        STEP
        print(step, round(loss.item(), 6))
    """,
    "nested-in-a-function": """
    def train(epochs):
        total = 0.0
        for epoch in range(epochs):
            for step, (x, y) in enumerate(data):
                STEP
                total += loss.item()
                with torch.no_grad():
                    print(epoch, step, f"{total:.5f}")
        return total

    print(f"{train(2):.5f}")
    """,
    "a-value-that-may-change": """
    cfg = {"every": 2}

    def lr_for(cfg, step):
        return 0.05 / (1 + step)

    for step, (x, y) in enumerate(data):
        lr = lr_for(cfg, step)
        STEP
        if step % cfg["every"] == 0:
            print(step, lr, round(loss.item(), 6))
    """,
    "a-trainer-class": """
    class Trainer:
        def __init__(self, every):
            self.history, self.every = [], every

        def fit(self):
            for step, (x, y) in enumerate(data):
                STEP
                self.history.append(loss.item())
                if step % self.every == 0:
                    print(step, round(self.history[-1], 6))
            return self.history

    print(len(Trainer(2).fit()))
    """,
    "a-trainer-class-holding-its-model": """
    class Trainer:
        def __init__(self, model, opt):
            self.model, self.optimizer, self.criterion = model, opt, nn.CrossEntropyLoss()
            self.history, self.every = [], 2

        def fit(self):
            for step, (x, y) in enumerate(data):
                out = self.model(x)
                loss = self.criterion(out, y)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                self.history.append(loss.item())
                if step % self.every == 0:
                    print(step, round(loss.item(), 6))

    Trainer(model, opt).fit()
    """,
    "settings-read-before-the-replay": """
    import argparse

    args = argparse.Namespace(device="cpu", log_interval=3)
    for step, (x, y) in enumerate(data):
        x, y = x.to(args.device), y.to(args.device)
        STEP
        if step % args.log_interval == 0:
            print(step, round(loss.item(), 6))
    """,
    "a-deferred-statement-raises": """
    try:
        for step, (x, y) in enumerate(data):
            STEP
            print(step, round(10 / (3 - step), 3), round(loss.item(), 6))
    except ZeroDivisionError as e:
        print("caught", e)
    """,
    "while": """
    step = 0
    while step < 6:
        x, y = data[step]
        step += 1
        STEP
        print(step, round(loss.item(), 6))
    """,
}


@pytest.mark.parametrize("body", LOOPS.values(), ids=LOOPS.keys())
def test_deferred_reads_print_the_same_lines(body, tmp_path):
    result = _deferred(body, tmp_path)
    assert "DeferredReads()" in result.code and ".push(" in result.code and ".flush()" in result.code


def test_what_the_deferred_statements_read_is_held_by_how_they_read_it(tmp_path):
    code = _deferred(LOOPS["two-items"], tmp_path).code
    assert "train_step_reads.push(copy=(loss, acc), keep=(x,), value=(step,))" in code
    assert 'print(f"{step_host}: loss {loss_host.item():.6f} acc {acc_host.item():.4f} n {x_host.size(0)}' in code


def test_a_value_that_may_change_is_held_as_it_is_and_run_at_once(tmp_path):
    """`cfg` is handed to a function before the replay: the runtime finds it mutable and runs the statements
    at once, as without the option."""
    code = _deferred(LOOPS["a-value-that-may-change"], tmp_path).code
    assert "train_step_reads.push(copy=(loss,), value=(step, cfg, lr))" in code


def test_a_path_the_rest_of_the_loop_only_reads_or_hands_elsewhere_is_read_when_they_run(tmp_path):
    """`args.device` handed to `.to()` leaves `args.log_interval` alone; `self.history` is the deferred
    statements' own where the loop names nothing else of `self`."""
    code = _deferred(LOOPS["settings-read-before-the-replay"], tmp_path).code
    assert "train_step_reads.push(copy=(loss,), value=(step,))" in code
    for case in ("a-trainer-class", "a-trainer-class-holding-its-model"):  # calling self.model(x) is the model's call
        code = _deferred(LOOPS[case], tmp_path).code
        assert "train_step_reads.push(copy=(loss,), value=(step,))" in code and "self.history.append(loss_host.item())" in code


def test_the_pasted_and_vendored_runtimes_hold_the_reads_too(tmp_path):
    code = _deferred(LOOPS["print-with-step"], tmp_path, RuntimeChoice("inline")).code
    assert "CapturedStep, GraphedModule, build_on_capture_stream, DeferredReads = _graphify_runtime()" in code
    plain = rewrite_source(_script(LOOPS["print-with-step"]), "script.py", runtime=RuntimeChoice("inline")).code
    assert "DeferredReads" not in plain  # pasted only where used
    assert "class DeferredReads" in vendor_code()


def test_without_the_option_nothing_is_deferred(tmp_path):
    script = _script(LOOPS["print-with-step"])
    assert "DeferredReads" not in rewrite_source(script, "script.py").code


NOT_DEFERRED = {
    "feeds-control-flow": """
    for step, (x, y) in enumerate(data):
        STEP
        if loss.item() < 1e-3:
            break
    """,
    "tensor-printed-as-is": """
    for step, (x, y) in enumerate(data):
        STEP
        print(loss.detach())
    """,
    "print-before-the-replay": """
    for step, (x, y) in enumerate(data):
        print("batch", step)
        STEP
        print(loss.item())
    """,
    "name-read-later-in-the-loop": """
    last = 0.0
    for step, (x, y) in enumerate(data):
        x = x * (1.0 + last * 0)
        STEP
        last = loss.item()
    """,
    "a-function-of-the-user": """
    def show(v):
        print(v)

    for step, (x, y) in enumerate(data):
        STEP
        show(loss.item())
    """,
    "meter-the-iterable-prints": """
    class Logger:
        def __init__(self):
            self.last = None

        def update(self, value):
            self.last = value

        def log_every(self, batches):
            for i, batch in enumerate(batches):
                print("logged", i, self.last)
                yield batch

    logger = Logger()
    for x, y in logger.log_every(data):
        STEP
        logger.update(round(loss.item(), 6))
    """,
    "a-method-of-the-same-object": """
    class Trainer:
        def __init__(self):
            self.history, self.seen = [], 0

        def count(self, x):
            self.seen += x.size(0)

        def fit(self):
            for step, (x, y) in enumerate(data):
                self.count(x)
                STEP
                self.history.append(loss.item())

    Trainer().fit()
    """,
    "scheduler-step": """
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 2)
    for step, (x, y) in enumerate(data):
        STEP
        print(loss.item())
        scheduler.step()
    """,
}


@pytest.mark.parametrize("body", NOT_DEFERRED.values(), ids=NOT_DEFERRED.keys())
def test_reads_that_feed_the_loop_or_print_otherwise_are_not_deferred(body, tmp_path):
    script = _script(body)
    deferred = rewrite_source(script, "script.py", _deferring())
    assert deferred.changed and "DeferredReads" not in deferred.code
    assert deferred.code == rewrite_source(script, "script.py").code


def test_only_the_statements_after_the_last_that_cannot_wait_are_deferred(tmp_path):
    body = """
    for step, (x, y) in enumerate(data):
        STEP
        if loss.item() > 100:
            break
        print(step, round(loss.item(), 6))
    """
    code = _deferred(body, tmp_path).code
    kept, deferred = code.split("train_step_reads.push(", 1)
    assert "if loss.item() > 100:" in kept and "print(step_host, round(loss_host.item(), 6))" in deferred


def test_a_deferred_rewrite_rewritten_again_is_unchanged(tmp_path):
    once = _deferred(LOOPS["meter"], tmp_path).code
    assert rewrite_source(once, "script.py", _deferring()).code == once


def test_the_option_and_its_config_key(tmp_path):
    script = _script(LOOPS["print-with-step"])
    out = CliRunner().invoke(cli.cli, ["rewrite", "--defer-host-reads", "-"], input=script)
    assert "train_step_reads.push(" in out.stdout
    (tmp_path / "pyproject.toml").write_text("[tool.graphify]\ndefer-host-reads = true\n")
    path = tmp_path / "train.py"
    path.write_text(script)
    assert "train_step_reads.push(" in CliRunner().invoke(cli.cli, ["rewrite", str(path)]).stdout
    assert "push(" not in CliRunner().invoke(cli.cli, ["rewrite", "--no-defer-host-reads", str(path)]).stdout
    (tmp_path / "pyproject.toml").write_text("[tool.graphify]\ndefer-host-reads = 1\n")
    result = CliRunner().invoke(cli.cli, ["rewrite", str(path)])
    assert result.exit_code == 2 and "defer-host-reads: expected true or false" in result.stderr


# ---- DeferredReads ---------------------------------------------------------------------------------


def test_each_push_hands_back_the_previous_steps_values_and_flush_the_last():
    reads = DeferredReads()
    loss = torch.tensor(1.5, requires_grad=True)
    assert list(reads.push(copy=(loss,), value=(0,))) == []
    with torch.no_grad():
        loss.fill_(2.5)  # the next replay overwrites the graph's output
    (held,) = reads.push(copy=(loss,), value=(1,))
    assert held[0].item() == 1.5 and held[1] == 0 and not held[0].requires_grad
    (last,) = reads.flush()
    assert last[0].item() == 2.5 and last[1] == 1
    assert list(reads.flush()) == []


def test_a_value_that_may_change_runs_everything_held_at_once():
    reads = DeferredReads()
    list(reads.push(copy=(torch.tensor(1.0),), value=(0,)))
    items = [1]
    entries = list(reads.push(copy=(torch.tensor(2.0),), value=(items,)))
    assert [e[0].item() for e in entries] == [1.0, 2.0] and entries[1][1] is items
    assert list(reads.flush()) == []


def test_a_run_left_unfinished_drops_what_is_still_held():
    reads = DeferredReads()
    list(reads.push(copy=(torch.tensor(1.0),)))
    with pytest.raises(ZeroDivisionError):
        for (value,) in reads.push(copy=(torch.tensor(2.0),)):
            print(1 / 0, value)
    assert list(reads.flush()) == []


def test_shapes_are_kept_as_they_are_and_numbers_pass_through():
    reads = DeferredReads()
    x = torch.zeros(4, 2)
    list(reads.push(copy=(3.5,), keep=(x,), value=("a", (1, 2.0), None)))
    ((copied, kept, *values),) = reads.flush()
    assert copied == 3.5 and kept is x and values == ["a", (1, 2.0), None]
