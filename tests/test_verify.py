"""`graphify verify` must be able to fail: wrong rewrites planted into the rewritten source are caught.

On the CPU the rewrite runs the very same eager code as the original, so an honest rewrite gives
bit-identical losses and parameters, and each planted mistake must show up as a difference (exit 1).
"""

import json
import re
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphify.cli import cli
from graphify.verify import verify_file

pytestmark = pytest.mark.slow

STEPS = 12

TRAIN = """\
import torch
import torch.nn as nn

device = "cpu"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
data = [(torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)) for _ in range(30)]

for x, y in data:
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    scheduler.step()
"""

# ReduceLROnPlateau fed with a host read of the loss: the value the rewrite must refresh every step.
PLATEAU = """\
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=0.0)
x, y = torch.randn(16, 8), torch.randn(16, 1)

for step in range(30):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    scheduler.step(loss.item())
"""


def write(tmp_path, text, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _replace(code, pattern, repl):
    new, n = re.subn(pattern, repl, code, flags=re.M)
    assert n >= 1, f"the planted mistake did not apply: {pattern!r}"
    return new


# ---- honest rewrites pass ------------------------------------------------------------------------


RESUMING = """\
import os
import torch
import torch.nn as nn

device = "cpu"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = [(torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)) for _ in range(6)]
start = 0
if os.path.exists("snapshot.pt"):  # resume where an earlier run stopped
    snapshot = torch.load("snapshot.pt")
    model.load_state_dict(snapshot["model"])
    start = snapshot["epoch"] + 1
for epoch in range(start, 2):
    for x, y in data:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    torch.save({"model": model.state_dict(), "epoch": epoch}, "snapshot.pt")
"""


@pytest.mark.parametrize("snapshot", ['"snapshot.pt"', 'os.path.join(tempfile.gettempdir(), "snapshot.pt")'])
def test_files_the_original_run_writes_do_not_reach_the_rewrites_run(tmp_path, snapshot):
    """A script that resumes from a snapshot it saves, beside it or in the temporary folder: the rewrite
    starts from the state the original found (not resumed from the original's snapshot), and the script's
    folder is left as it was."""
    script = RESUMING.replace("import os", "import os\nimport tempfile").replace('"snapshot.pt"', snapshot)
    report = verify_file(write(tmp_path, script), steps=STEPS)
    assert report.passed, (report.message, report.detail)
    assert report.comparison.steps == (STEPS, STEPS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_identical_rewrite_passes_exactly_on_cpu(tmp_path):
    report = verify_file(write(tmp_path, TRAIN), steps=STEPS)
    assert report.passed, (report.message, report.detail)
    c = report.comparison
    assert c.exact and (c.rtol, c.atol) == (0.0, 0.0)
    assert c.steps == (STEPS, STEPS)
    assert c.losses.compared == STEPS and c.losses.max_abs == 0.0
    assert c.forced == STEPS - 1  # steps 2.. start from the original's state after the step before
    assert c.params.compared == STEPS - 1 and c.params.max_rel == 0.0
    assert c.state.compared == STEPS - 1  # Adam's exp_avg and exp_avg_sq
    assert report.loop["step_function"] == "train_step"
    assert "no speedup can be measured" in report.verdict
    assert report.speedup is None


def test_host_read_feeding_the_scheduler_passes(tmp_path):
    report = verify_file(write(tmp_path, PLATEAU), steps=STEPS)
    assert report.passed, (report.message, report.detail)
    assert float(report.rewrite.tensors["state"]["optimizer0.group0.lr"]) == 0.05  # the loss kept improving
    assert report.comparison.forced == STEPS - 1


def test_script_with_argparse_main_guard_sibling_import_and_dropout(tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "settings.txt").write_text("16\n")  # read relative to the working directory
    write(
        project,
        """\
        import torch.nn as nn

        def make_model(hidden):
            return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 1))
    """,
        "nets.py",
    )
    script = write(
        project,
        """\
        import argparse
        import os

        import torch
        import torch.nn.functional as F
        from torch.utils.data import DataLoader, TensorDataset

        from nets import make_model


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--lr", type=float, default=1e-3)
            parser.add_argument("--batch-size", type=int, default=8)
            args = parser.parse_args()
            assert args.lr == 0.01 and args.batch_size == 4, args
            assert os.path.basename(__file__) == "train.py"
            hidden = int(open("settings.txt").read())
            model = make_model(hidden)
            optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
            data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
            loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
            for epoch in range(3):
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = F.mse_loss(model(x), y)
                    loss.backward()
                    optimizer.step()


        if __name__ == "__main__":
            main()
    """,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    report = verify_file(script, steps=20, args=["--lr", "0.01", "--batch-size", "4"])
    assert report.passed, (report.message, report.detail)
    assert report.comparison.steps == (20, 20)
    assert report.loop["function"] == "main"


# ---- planted mistakes are caught -----------------------------------------------------------------


def stale_input(code):
    """(a) A static buffer never refreshed: every replay trains on the first batch."""
    return _replace(
        code, r"^(\s*)(\w+) = train_step\(x, y\)$", r"\1_first = _first if '_first' in dir() else (x, y)\n\1\2 = train_step(*_first)"
    )


def item_frozen_at_capture(code):
    """(b) `.item()` left inside the graph: the host value is read once, at capture, never again."""
    return _replace(
        code,
        r"^(\s*)scheduler\.step\(loss\.item\(\)\)$",
        r"\1_frozen = _frozen if '_frozen' in dir() else loss.item()\n\1scheduler.step(_frozen)",
    )


def host_code_runs_once(code):
    """(b) Host statements captured with the step run at capture only: here the per-step logging."""
    return _replace(code, r"^(\s*)(__graphify_probe__\(.*\))$", r"\1if '_logged' not in dir():\n\1    _logged = True\n\1    \2")


def frozen_learning_rate(code):
    """(c) The scheduler step dropped: the learning rate stays at its first value."""
    return _replace(code, r"^\s*scheduler\.step\(\)\n", "")


@pytest.mark.parametrize(
    "source, mutate, expect",
    [
        (TRAIN, stale_input, "losses differ"),
        (PLATEAU, item_frozen_at_capture, "differ"),
        (TRAIN, host_code_runs_once, "the original ran 12 steps, the rewrite 1"),
        (TRAIN, frozen_learning_rate, "parameters differ at step 2"),
    ],
    ids=["stale-static-input", "item-frozen-at-capture", "host-logging-runs-once", "frozen-lr"],
)
def test_wrong_rewrite_fails(tmp_path, source, mutate, expect):
    report = verify_file(write(tmp_path, source), steps=STEPS, rewrite_hook=mutate)
    assert report.exit_code == 1 and not report.passed
    assert expect in report.message


def test_mistake_within_tolerance_passes_and_outside_fails(tmp_path):
    """Tolerances are honoured: a tiny perturbation of the learning rate passes a loose rtol."""
    path = write(tmp_path, TRAIN)
    nudge = lambda code: _replace(code, r"^(\s*)scheduler\.step\(\)$", r"\1scheduler.step()\n\1optimizer.param_groups[0]['lr'] *= 1 + 1e-9")
    assert verify_file(path, steps=STEPS, rewrite_hook=nudge).exit_code == 1  # exact on the CPU
    assert verify_file(path, steps=STEPS, rtol=1e-3, atol=1e-6, rewrite_hook=nudge).passed


# ---- scripts that cannot be verified -------------------------------------------------------------


def test_crashing_original_exits_2(tmp_path):
    path = write(
        tmp_path,
        TRAIN.replace(
            "    scheduler.step()\n", "    scheduler.step()\n    if scheduler.last_epoch == 3:\n        raise RuntimeError('disk full')\n"
        ),
    )
    report = verify_file(path, steps=STEPS)
    assert report.exit_code == 2
    assert report.message.startswith("the original script failed")
    assert "RuntimeError: disk full" in report.detail
    assert "graphify/verify/child.py" not in report.detail  # the script's traceback, not ours
    assert report.rewrite is None  # the rewrite is not run


def test_crashing_rewrite_exits_1(tmp_path):
    boom = lambda code: _replace(code, r"^(\s*)(\w+ = train_step\(x, y\))$", r"\1\2\n\1raise ValueError('boom')")
    report = verify_file(write(tmp_path, TRAIN), steps=STEPS, rewrite_hook=boom)
    assert report.exit_code == 1
    assert report.message.startswith("the rewritten script failed")
    assert "ValueError: boom" in report.detail


def test_nothing_to_rewrite_exits_2(tmp_path):
    report = verify_file(write(tmp_path, "import torch\nprint(torch.ones(2).sum())\n"), steps=STEPS)
    assert report.exit_code == 2 and "nothing to verify" in report.message


def test_missing_file_exits_2(tmp_path):
    report = verify_file(str(tmp_path / "nope.py"))
    assert report.exit_code == 2 and "cannot read" in report.message


# ---- command line --------------------------------------------------------------------------------


def test_cli_json_and_a_script_that_ends_before_the_steps(tmp_path):
    script = write(tmp_path, TRAIN.replace("lr=0.05", "lr=float(__import__('sys').argv[2])").replace("range(30)", "range(5)"))
    result = CliRunner().invoke(cli, ["verify", script, "--steps", "50", "--json", "--", "--lr", "0.01"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "passed" and doc["exit_code"] == 0
    assert doc["args"] == ["--lr", "0.01"]
    assert doc["steps"] == {"original": 5, "rewrite": 5}  # compares what there is
    assert doc["runs"]["original"]["ended"] == "script-ended"
    assert doc["tolerance"] == {"rtol": 0.0, "atol": 0.0, "exact": True, "precision": "float32", "update_tol": 0.0, "steps_compared": 5}
    assert doc["losses"]["first_divergent_step"] is None and doc["losses"]["compared"] == 5
    assert len(doc["runs"]["original"]["values"]) == 5
    assert doc["on_cuda"] is False and doc["speedup"] is None


def test_cli_text_failure(tmp_path):
    script = write(tmp_path, TRAIN.replace("for x, y in data:", "raise SystemExit('no data')\nfor x, y in data:"))
    result = CliRunner().invoke(cli, ["verify", script, "--steps", "4"])
    assert result.exit_code == 2
    assert "the original script failed" in result.stderr and "no data" in result.stderr  # an error: on stderr


# ---- on a GPU ------------------------------------------------------------------------------------

TRAIN_CUDA = TRAIN.replace('device = "cpu"', 'device = "cuda"')


@pytest.mark.cuda
def test_cuda_rewrite_passes_with_default_tolerance_and_is_timed(tmp_path, always_capture):
    report = verify_file(write(tmp_path, TRAIN_CUDA), steps=30)
    assert report.passed, (report.message, report.detail, report.to_dict())
    c = report.comparison
    assert report.on_cuda and not c.exact and (c.rtol, c.atol, c.update_tol) == (1e-5, 1e-7, 1e-3)
    assert report.rewrite.data["graphs"] >= 1
    assert report.speedup is not None and report.original.step_ms > 0
    assert report.rewrite.setup_s is not None
    original, rewrite = report.original.data["profile"], report.rewrite.data["profile"]
    assert original["kernels_per_step"] > 0 and original["graph_launches_per_step"] == 0
    assert rewrite["graph_launches_per_step"] >= 0.99
    assert rewrite["launches_per_step"] < original["launches_per_step"]
    assert report.verdict


# The same training under bf16 autocast: looser default tolerances.
TRAIN_CUDA_BF16 = TRAIN_CUDA.replace(
    "    loss = nn.functional.mse_loss(model(x), y)\n",
    "    with torch.autocast('cuda', dtype=torch.bfloat16):\n        loss = nn.functional.mse_loss(model(x).float(), y)\n",
)


@pytest.mark.cuda
def test_cuda_bf16_rewrite_passes_with_bf16_tolerances(tmp_path):
    report = verify_file(write(tmp_path, TRAIN_CUDA_BF16), steps=20, profile=False)
    assert report.passed, (report.message, report.detail, report.to_dict())
    doc = report.to_dict()
    assert doc["tolerance"]["precision"] == "bfloat16" and doc["tolerance"]["rtol"] == 1e-2
    assert report.rewrite.data["graphs"] >= 1


@pytest.mark.cuda
@pytest.mark.parametrize("source", [TRAIN_CUDA, TRAIN_CUDA_BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mutate", [stale_input, frozen_learning_rate, host_code_runs_once], ids=lambda f: f.__name__)
def test_cuda_wrong_rewrite_fails(tmp_path, source, mutate):
    report = verify_file(write(tmp_path, source), steps=20, rewrite_hook=mutate, profile=False)
    assert report.exit_code == 1, (report.message, report.detail)


# ---- a given rewrite ----------------------------------------------------------------------------


def test_a_given_rewrite_is_verified_and_a_wrong_one_fails(tmp_path):
    """`--rewritten FILE`: the user's own rewrite (here graphify's, saved, then edited) against the original."""
    from graphify.rewrite import rewrite_source

    path = write(tmp_path, TRAIN)
    good = tmp_path / "good.py"
    good.write_text(rewrite_source(Path(path).read_text(), path).code)
    report = verify_file(path, steps=STEPS, rewritten=str(good))
    assert report.passed and report.comparison.forced == STEPS - 1, (report.message, report.detail)
    bad = tmp_path / "bad.py"
    bad.write_text(frozen_learning_rate(good.read_text()))
    report = verify_file(path, steps=STEPS, rewritten=str(bad))
    assert report.exit_code == 1 and "parameters differ at step 2" in report.message
    result = CliRunner().invoke(cli, ["verify", path, "--steps", "4", "--rewritten", str(tmp_path / "missing.py")])
    assert result.exit_code == 2 and "cannot read" in result.stderr and "missing.py" in result.stderr


def test_a_loop_reentered_each_epoch_is_forced_across_epochs():
    """train() called once per epoch: the rewrite's helper is rebuilt each epoch and replays the same
    graph; every step of every epoch is compared from the original's state."""
    path = Path(__file__).resolve().parents[1] / "fixtures" / "traps" / "train_fn_per_epoch.py"
    report = verify_file(str(path), steps=100000, profile=False)
    assert report.passed, (report.message, report.detail)
    c = report.comparison
    assert c.exact and c.steps[0] == c.steps[1] == 48  # 3 epochs of 16 steps
    assert c.forced == 47 and c.params.compared == 47


EPOCHS = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
x, y = torch.randn(8, 4), torch.randn(8, 1)


def train(epoch):
    for step in range(60):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()


for epoch in range(10):
    train(epoch)
"""


def test_by_default_a_reentered_loop_runs_into_its_second_entry(tmp_path):
    report = verify_file(write(tmp_path, EPOCHS), profile=False)
    assert report.passed, (report.message, report.detail)
    assert report.comparison.steps == (70, 70)  # entered again at step 60, then 10 more steps
    assert report.original.data["entries"] == [0, 60]
    assert [w.split(":")[0] for w in report.warnings] == ["the learning rate did not change within the 70 compared steps"]


def test_a_short_run_says_what_it_did_not_cover(tmp_path):
    report = verify_file(write(tmp_path, EPOCHS), steps=20, profile=False)
    assert report.passed
    assert [w.split(":")[0] for w in report.warnings] == [
        "the run stopped after 20 steps, before the loop was entered a second time (a second epoch)",
        "the learning rate did not change within the 20 compared steps",
    ]
    result = CliRunner().invoke(cli, ["verify", write(tmp_path, EPOCHS, "again.py"), "--steps", "20", "--json"])
    assert len(json.loads(result.stdout)["warnings"]) == 2


NONDETERMINISTIC = """\
import os

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
# batches from the operating system's entropy: every run of the script sees other data
raw = torch.tensor(list(os.urandom(20 * 16 * 9)), dtype=torch.float32).reshape(20, 16, 9) / 255
data = [(b[:, :8], b[:, 8:]) for b in raw]
for x, y in data:
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
"""


def test_differences_the_original_makes_with_itself_are_no_failure(tmp_path):
    """A script whose steps differ from run to run (here its data; on a GPU, atomic scatter-adds): verify runs
    the original once more on its own trajectory and judges the rewrite against what the two differ by."""
    report = verify_file(write(tmp_path, NONDETERMINISTIC), steps=STEPS)
    assert report.passed, (report.message, report.detail)
    assert "within the original's own run-to-run differences" in report.message
    assert any("two runs of the original differ too" in w for w in report.warnings)


def test_a_rewrite_beyond_the_originals_own_differences_fails():
    from graphify.verify import NOISE_FACTOR, _within_noise
    from graphify.verify.compare import Comparison, Diff

    def comparison(params_rel: float) -> Comparison:
        params = Diff()
        params.add("step 2", params_rel, 1.0, 0.0, 0.0)
        return Comparison(0.0, 0.0, 0.0, True, (5, 5), Diff(), params, Diff(), 4)

    noise = comparison(0.01)
    assert _within_noise(comparison(NOISE_FACTOR * 0.01), noise)
    assert not _within_noise(comparison(NOISE_FACTOR * 0.01 * 1.5), noise)
    assert not _within_noise(Comparison(0.0, 0.0, 0.0, True, (5, 4), Diff(), Diff(), Diff(), 4), noise)
