"""Tensors a step builds from host values (random draws above all) are built before the step call, in
their order, and handed to it as inputs: plan/draws.py. Anything that would change what they read or
the order of the host generator's draws keeps the loop refused."""

from pathlib import Path

import pytest

from graphify.rewrite import rewrite_source

TEMPLATE = """import numpy as np
import torch
device = "cuda"
model = torch.nn.Linear(4, 4).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    x = x.to(device)
    out = model(x)
    {line}
    loss = (out + extra).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize(
    ("line", "drawn"),
    [
        ("extra = torch.randn(4).to(device)", "extra_drawn = torch.randn(4).to(device)"),
        ("extra = torch.zeros(4).to(device, torch.float16)", "extra_drawn = torch.zeros(4).to(device, torch.float16)"),
        ("extra = torch.arange(4.0).to(device)", "extra_drawn = torch.arange(4.0).to(device)"),
        (
            "extra = torch.from_numpy(np.random.rand(4)).float().to(device)",
            "extra_drawn = torch.from_numpy(np.random.rand(4)).float().to(device)",
        ),
        (
            "extra = torch.tensor(np.random.normal(0, 1, (x.shape[0], 4)), device=device)",
            "extra_drawn = torch.tensor(np.random.normal(0, 1, (x.shape[0], 4)), device=device)",
        ),
    ],
)
def test_host_built_tensors_are_built_before_the_step(settings, line, drawn):
    result = rewrite_source(TEMPLATE.format(line=line), "train.py", settings)
    assert result.outcomes[0].rewritten, result.outcomes[0].reasons
    code = result.code
    assert "    extra = extra_drawn\n" in code  # inside the step function
    assert code.index(f"\n    {drawn}\n") < code.rindex("train_step(x, extra_drawn)")  # before the call, in the loop


def test_two_draws_keep_their_order(settings):
    source = TEMPLATE.format(line="extra = torch.randn(4).to(device)").replace(
        "    loss.backward()\n", "    loss.backward()\n    noise = torch.rand(4).to(device)\n    (model(x + noise).sum()).backward()\n"
    )
    result = rewrite_source(source, "train.py", settings)
    assert result.outcomes[0].rewritten, result.outcomes[0].reasons
    first, second = result.code.index("extra_drawn = torch.randn(4)"), result.code.index("noise_drawn = torch.rand(4)")
    assert first < second < result.code.rindex("train_step(x, extra_drawn, noise_drawn)")


@pytest.mark.parametrize(
    "line",
    [
        "extra = torch.randn(out.shape[0]).to(device)",  # reads what the step computed before it
        "extra = torch.randn(4).to(device) if x.is_cuda else torch.zeros(4, device=device)",  # drawn on one branch only
        "extra = torch.randn(4).to(device) + torch.rand(4).to(device)",  # two draws in one statement
        "extra = torch.randn(4, generator=gen).to(device)",  # another generator
        "extra = torch.randn(4).to(device); np.random.shuffle(order)",  # another host draw stays in the step
        "extra = make_noise(4).to(device)",  # code the analysis does not see may do anything
    ],
)
def test_draws_that_would_change_the_training_still_block(settings, line):
    """The whole step is not captured (the model alone may be: the draws stay eager where they are)."""
    result = rewrite_source(TEMPLATE.format(line=line), "train.py", settings)
    assert result.outcomes[0].verdict.value in ("not-capturable", "partially-capturable")
    assert "CapturedStep" not in result.code and "_drawn" not in result.code


def test_the_same_numbers_on_the_cpu(settings, tmp_path):
    """The rewritten loop draws the same noise in the same order: its losses equal the original's."""
    torch = pytest.importorskip("torch")
    source = """import torch
torch.manual_seed(0)
device = "cpu"
model = torch.nn.Linear(4, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [torch.randn(8, 4) for _ in range(6)]
losses = []
for x in loader:
    x = x.to(device)
    z = torch.randn(8, 4).to(device)
    loss = model(x + z).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    w = torch.randn(8, 4).to(device)
    loss2 = model(w).mean()
    opt.zero_grad()
    loss2.backward()
    opt.step()
    losses.append(loss.item() + loss2.item())
"""
    result = rewrite_source(source, "train.py", settings)
    assert result.outcomes[0].rewritten, result.outcomes[0].reasons
    original, rewritten = {}, {}
    exec(compile(source, "train.py", "exec"), original)
    exec(compile(result.code, "train.py", "exec"), rewritten)
    assert rewritten["losses"] == original["losses"]
    assert torch.equal(rewritten["model"].weight, original["model"].weight)


def test_the_gan_trap_prints_the_same_on_the_cpu(settings, capsys):
    """fixtures/traps/gan_host_noise.py: host noise drawn before the step, and `real_score = outputs`
    kept in its place inside the step (after the call it would read the generator pass's `outputs`)."""
    pytest.importorskip("torch")
    path = Path(__file__).resolve().parents[1] / "fixtures" / "traps" / "gan_host_noise.py"
    source = path.read_text()
    result = rewrite_source(source, str(path), settings)
    assert result.outcomes[0].rewritten, result.outcomes[0].reasons
    assert "\n    real_score = outputs" in result.code  # inside the step function
    printed = []
    for code in (source, result.code):
        exec(compile(code, str(path), "exec"), {"__name__": "__main__"})
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and printed[0].count("epoch") == 3


MICRO_STEPS = """import torch
device = "cuda"
model = torch.nn.Linear(4, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = iter(loader)
for it in range(100):
    for micro in {header}:
        {fetch}
        loss = model(x.to(device)).sum() / 4
        loss.backward()
    opt.step()
    opt.zero_grad()
    print(loss.item())
"""


def test_a_batch_fetched_in_each_micro_step_is_fetched_before_the_step_in_the_same_order(settings):
    result = rewrite_source(MICRO_STEPS.format(header="range(4)", fetch="x = next(batches)"), "train.py", settings)
    assert result.outcomes[0].rewritten, result.outcomes[0].reasons
    code = result.code
    assert "def train_step(x_each_drawn):" in code  # `loss` is bound in the micro-steps before it is read
    assert "        x = x_each_drawn[micro]\n" in code  # pass `micro` reads the micro-th batch
    # the runtime fetches them in pass order while the step runs eagerly, all four before a replay
    assert code.index("    x_each_drawn = train_step.fetch(lambda: next(batches), 4)\n") < code.rindex("loss = train_step(x_each_drawn)")


def test_a_batch_fetched_inside_the_model_call_is_fetched_before_the_step(settings):
    source = MICRO_STEPS.format(header="range(4)", fetch="pass").replace("model(x.to(device))", "model(next(batches).to(device))")
    result = rewrite_source(source, "train.py", settings)
    assert result.outcomes[0].rewritten, result.outcomes[0].reasons
    assert "batches_drawn = train_step.fetch(lambda: next(batches).to(device), 4)" in result.code
    assert "loss = model(batches_drawn[micro]).sum() / 4" in result.code


@pytest.mark.parametrize(
    ("header", "fetch"),
    [
        ("range(1, 4)", "x = next(batches)"),  # not counted from 0: pass i would not read the i-th batch
        ("range(4)", "x = next(batches) if micro % 2 else x"),  # fetched in some passes only
        ("range(4)", "x = next(batches)\n        micro = 0"),  # the pass index rebound
        ("range(4)", "x = next(batches)\n        if x.sum() > 0:\n            break"),  # fewer passes than counted
        ("range(4)", "x = next(batches)\n        y = next(batches)"),  # a second fetch stays in the step
        ("range(4)", "x = next(batches, None)"),  # a default value
        ("[0, 1, 2, 3]", "x = next(batches)"),  # not a range
    ],
)
def test_fetches_that_cannot_move_before_the_step_keep_the_step_eager(settings, header, fetch):
    result = rewrite_source(MICRO_STEPS.format(header=header, fetch=fetch), "train.py", settings)
    outcome = result.outcomes[0]
    assert not outcome.rewritten or outcome.model_only  # at most the model's forward and backward are graphed
    assert "_drawn" not in result.code


@pytest.mark.parametrize(
    ("line", "fetched"),
    [
        ("loss = model(next(batches).to(device)).sum()", True),  # fetched before anything of the step runs
        ("loss = (model(x.to(device)) * next(batches).to(device)).sum()", False),  # after the forward pass
    ],
)
def test_a_batch_fetched_in_the_step_is_fetched_before_it_only_ahead_of_the_step_work(settings, line, fetched):
    source = MICRO_STEPS.replace(
        "    for micro in {header}:\n        {fetch}\n        loss = model(x.to(device)).sum() / 4\n", f"    x = 1\n    {line}\n"
    )
    source = source.replace("        loss.backward()", "    loss.backward()")
    result = rewrite_source(source, "train.py", settings)
    assert ("batch_drawn = next(batches).to(device)" in result.code) is fetched, result.code


def test_a_draw_after_the_micro_steps_keeps_the_step_eager(settings):
    """The micro-steps' batches are fetched during the call (or at its start), a host draw before it: a draw
    made after the micro-steps in the source would move ahead of the fetches that share its generator."""
    source = MICRO_STEPS.format(header="range(4)", fetch="x = next(batches)").replace(
        "    opt.step()\n", "    noise = torch.randn(4).to(device)\n    (model(noise).sum()).backward()\n    opt.step()\n"
    )
    result = rewrite_source(source, "train.py", settings)
    assert "_drawn" not in result.code
