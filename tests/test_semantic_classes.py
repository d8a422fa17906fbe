"""Classes of code the analysis must understand by what it means, not by how one script spells it. Each
class is tested over variants: tensor metadata is host data; values nothing in the loop rebinds are
constants of the loop; host bookkeeping (meters, lists, progress bars) moves after the replay; mode calls
at the top of a step are replayed by the runtime; every refusal names its real blocker."""

from __future__ import annotations

import textwrap

import pytest

from graphify.config import Settings
from graphify.engine import analyze_source
from graphify.rewrite import rewrite_source

_HEADER = """\
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm
"""


def _outcomes(source: str):
    result = rewrite_source(_HEADER + textwrap.dedent(source), "train.py", Settings())
    assert not result.errors, result.errors
    return result


def _train_loops(result):
    return [o for o in result.outcomes if o.kind == "train"]


def _codes(source: str) -> set[str]:
    report = analyze_source(_HEADER + textwrap.dedent(source), "train.py", Settings())
    return {d.code for d in report.diagnostics}


# ---- 1. tensor metadata is host data ------------------------------------------------------------

_METADATA_MODEL = """
class Generator(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 10))

    def forward(self, input):
        if {condition}:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)
        return output


def main(loader):
    device = torch.device("cuda")
    net = Generator(1).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for epoch in range(3):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = ((net(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
"""

METADATA_CONDITIONS = [
    "input.is_cuda and self.ngpu > 1",
    "(input.is_cuda or input.is_xpu) and self.ngpu > 1",
    "input.is_mps or input.is_xpu",
    'input.device.type == "cuda" and self.ngpu > 1',
    "input.dim() == 3 and input.shape[-1] > 1",
    "input.ndim + 1 > 2",
    "input.requires_grad or input.dtype == torch.float16",
    "input.size(0) % 2 == 0 and not input.is_sparse",
    "input.is_contiguous() and input.numel() > 4",
    "len(input) > 2 * input.size(1)",
]


@pytest.mark.parametrize("condition", METADATA_CONDITIONS)
def test_a_branch_on_tensor_metadata_is_no_tensor_branch(condition):
    source = _METADATA_MODEL.format(condition=condition)
    assert "GFY101" not in _codes(source)
    [loop] = _train_loops(_outcomes(source))
    assert loop.rewritten and not loop.model_only, loop.reasons


def test_a_branch_on_a_tensor_value_next_to_metadata_is_still_one():
    source = _METADATA_MODEL.format(condition="input.is_cuda and input.sum() > 0")
    assert "GFY101" in _codes(source)
    [loop] = _train_loops(_outcomes(source))
    assert not loop.rewritten or loop.model_only


def test_a_metadata_read_in_a_bookkeeping_call_is_no_gpu_work():
    """`meter.update(loss.item(), x.size(0))`: `x.size(0)` reads a shape, it launches nothing."""
    source = """
    def main(model, loader, device):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        seen = []
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            seen.append((loss.item(), x.size(0), x.shape[0], x.dim()))
        return seen
    """
    [loop] = _train_loops(_outcomes(source))
    assert loop.rewritten and not loop.model_only, loop.reasons


# ---- 2. values nothing in the loop rebinds are constants of the loop ----------------------------

_INVARIANT_BRANCHES = {
    "parameter": """
    def train(model, loader, opt, device, use_amp):
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            if use_amp:
                with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                    loss = F.cross_entropy(model(x), y)
            else:
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    """,
    "config-attribute": """
    def train(model, loader, opt, args):
        for x, y in loader:
            x, y = x.to(args.device), y.to(args.device)
            opt.zero_grad()
            if args.mixed_precision and args.device == "cuda":
                with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                    loss = F.cross_entropy(model(x), y)
            else:
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    """,
    "self-attribute": """
    class Trainer:
        def __init__(self, model, opt, use_amp):
            self.model, self.opt, self.use_amp = model, opt, use_amp

        def fit(self, loader):
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                self.opt.zero_grad()
                if self.use_amp:
                    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                        loss = F.cross_entropy(self.model(x), y)
                else:
                    loss = F.cross_entropy(self.model(x), y)
                loss.backward()
                self.opt.step()
    """,
    "model-choice": """
    def train(model, ema_model, loader, opt, distill):
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            out = model(x)
            if distill:
                with torch.no_grad():
                    target = ema_model(x).softmax(-1)
                loss = F.kl_div(out.log_softmax(-1), target, reduction="batchmean")
            else:
                loss = F.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """,
}


@pytest.mark.parametrize("name", sorted(_INVARIANT_BRANCHES))
def test_a_branch_on_a_value_the_loop_never_rebinds_is_captured(name):
    [loop] = _train_loops(_outcomes(_INVARIANT_BRANCHES[name]))
    assert loop.rewritten and not loop.model_only, loop.reasons
    assert "GFY705" not in loop.reasons and "GFY706" not in loop.reasons


def test_the_branch_outcome_keys_the_graph():
    """The runtime keys its graphs by the branch's outcome: a value changed between entries of the loop
    selects another graph instead of replaying the one captured for the old value."""
    result = _outcomes(_INVARIANT_BRANCHES["parameter"])
    assert "key=(use_amp,)" in result.code


def test_a_branch_on_a_value_the_step_itself_changes_stays_refused():
    source = """
    def train(model, loader, opt):
        warm = True
        for x, y in loader:
            x = x.cuda()
            opt.zero_grad()
            if warm:
                loss = model(x).pow(2).mean()
                warm = model(x).sum().item() > 0
            else:
                loss = model(x).abs().mean()
            loss.backward()
            opt.step()
    """
    [loop] = _train_loops(_outcomes(source))
    assert not loop.rewritten or loop.model_only


# ---- 3. host bookkeeping is not GPU state --------------------------------------------------------

_METER = """
class AverageMeter:
    def __init__(self):
        self.reset()

    def reset(self):
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count
"""

_BOOKKEEPING = {
    "meter-between-forward-and-backward": """
    def train(model, loader, opt, device):
        losses = AverageMeter()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            out = model(x)
            loss = F.cross_entropy(out, y)
            losses.update(loss.item(), x.size(0))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return losses.avg
    """,
    "meter-between-backward-and-step": """
    def train(model, loader, opt, device):
        top = AverageMeter()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            top.update(loss.item(), x.shape[0])
            opt.step()
        return top.avg
    """,
    "numpy-append": """
    def train(model, loader, opt, device):
        history = np.array([])
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            history = np.append(history, loss.item())
            loss.backward()
            opt.step()
        return history
    """,
    "dict-of-metrics": """
    def train(model, loader, opt, device):
        metrics = {}
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            metrics["loss"] = loss.item()
            loss.backward()
            opt.step()
        return metrics
    """,
    "progress-bar": """
    def train(model, loader, opt, device):
        bar = tqdm(loader)
        for x, y in bar:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            bar.set_postfix(loss=loss.item())
            loss.backward()
            opt.step()
    """,
}


@pytest.mark.parametrize("name", sorted(_BOOKKEEPING))
def test_host_bookkeeping_nothing_in_the_step_reads_moves_after_the_replay(name):
    result = _outcomes(_METER + textwrap.dedent(_BOOKKEEPING[name]))
    [loop] = _train_loops(result)
    assert loop.rewritten and not loop.model_only, loop.reasons
    assert "GFY703" not in loop.reasons


def test_a_meter_the_step_reads_stays_refused():
    """The meter's average feeds the loss: its update must run at every step, before the loss."""
    source = _METER + textwrap.dedent(
        """
    def train(model, loader, opt, device):
        norm = AverageMeter()
        norm.update(1.0)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            out = model(x)
            norm.update(x.shape[0])
            loss = F.cross_entropy(out, y) / norm.avg
            loss.backward()
            opt.step()
    """
    )
    [loop] = _train_loops(_outcomes(source))
    assert not loop.rewritten or loop.model_only


def test_a_refused_meter_is_reported_at_the_call_in_the_loop():
    source = _METER + textwrap.dedent(
        """
    def train(model, loader, opt, device):
        norm = AverageMeter()
        norm.update(1.0)
        for x, y in loader:
            x = x.to(device)
            opt.zero_grad()
            norm.update(x.shape[0])
            loss = model(x).pow(2).mean() / norm.avg
            loss.backward()
            opt.step()
    """
    )
    report = analyze_source(_HEADER + textwrap.dedent(source), "train.py", Settings())
    lines = {d.line for d in report.diagnostics if d.code == "GFY703"}
    lines_of_source = textwrap.dedent(source).splitlines()
    meter_call = 1 + _HEADER.count("\n") + next(i for i, text in enumerate(lines_of_source) if text.strip() == "norm.update(x.shape[0])")
    assert lines == {meter_call}


# ---- 4. mode calls once per step ----------------------------------------------------------------

_MODE_CALLS = {
    "train-at-the-top-of-a-full-batch-step": """
    def train(model, x, y, opt):
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def main(model, x, y):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for epoch in range(1, 201):
            loss = train(model, x, y, opt)
            if epoch % 10 == 0:
                print(epoch, loss.item())
    """,
    "train-in-the-loop-body": """
    def main(model, loader, opt):
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            model.train()
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    """,
    "eval-of-a-teacher-in-the-step": """
    def main(student, teacher, loader, opt):
        for x, y in loader:
            x = x.cuda()
            teacher.eval()
            with torch.no_grad():
                target = teacher(x)
            loss = F.mse_loss(student(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """,
}


@pytest.mark.parametrize("name", sorted(_MODE_CALLS))
def test_a_mode_call_in_the_step_is_replayed_not_refused(name):
    [loop] = _train_loops(_outcomes(_MODE_CALLS[name]))
    assert loop.rewritten and not loop.model_only, loop.reasons
    assert "GFY703" not in loop.reasons


def test_a_hook_registered_in_the_step_stays_refused():
    source = """
    def main(model, loader, opt):
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            opt.zero_grad()
            out = model(x)
            model.register_forward_hook(lambda m, i, o: None)
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
    """
    [loop] = _train_loops(_outcomes(source))
    assert not loop.rewritten or loop.model_only


# ---- 7. reasons that are true but not the blocker; device values by what they hold -------------

_DEVICE_COPIES = """
def main(loader):
    {device} = {device_value}
    model = nn.Linear(10, 3).to({device})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    X = torch.randn(1000, 10{made_on})
    Y = torch.randint(0, 3, (1000,){made_on})
    for epoch in range(10):
        for i in range(0, 1000, 100):
            xb = X[i : i + 100].to({device})
            yb = Y[i : i + 100].view(-1).to({device})
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
"""


@pytest.mark.parametrize("device", ["device", "dev_", "where"])
@pytest.mark.parametrize("device_value", ['torch.device("cuda")', '"cuda" if torch.cuda.is_available() else "cpu"', '"cuda:0"'])
def test_a_device_copy_is_told_by_what_the_device_value_holds_not_its_name(device, device_value):
    source = _DEVICE_COPIES.format(device=device, device_value=device_value, made_on="")
    assert "GFY301" in _codes(source)


@pytest.mark.parametrize("device", ["device", "dev_"])
def test_moving_a_tensor_already_on_the_device_is_no_breaker(device):
    source = _DEVICE_COPIES.format(device=device, device_value='torch.device("cuda")', made_on=f", device={device}")
    assert "GFY301" not in _codes(source)
    [loop] = _train_loops(_outcomes(source))
    assert loop.rewritten and not loop.model_only, loop.reasons


@pytest.mark.parametrize("prints", [False, True])
def test_a_local_meter_is_logging_only_when_its_body_prints(prints):
    """`meter.update(loss.item())` after the step: host sums are bookkeeping (as a list's append is, GFY511
    does not apply); a meter whose update prints is logging."""
    meter = (
        _METER.replace("        self.avg = self.sum / self.count\n", "        self.avg = self.sum / self.count\n        print(self.avg)\n")
        if prints
        else _METER
    )
    source = meter + textwrap.dedent(
        """
        def train(model, loader, opt, device):
            meter = AverageMeter()
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                meter.update(loss.item())
        """
    )
    assert ("GFY511" in _codes(source)) is prints


@pytest.mark.parametrize(
    "draws",
    [
        "step = next(steps)\n        x, y = next(batches)",  # steps = iter(range(n)), batches = iter(loader)
        "step, (x, y) = next(numbered)",  # numbered = iter(enumerate(loader))
    ],
)
def test_a_counter_drawn_with_next_is_a_host_value(draws):
    """`while True: step = next(it)` over `iter(range(n))`: what it draws is what `range` yields, a host int,
    as the `for` loop it replaces binds; `if step % 10 == 0` is no tensor branch."""
    source = f"""
    def train(model, loader, opt, n):
        steps, batches, numbered = iter(range(n)), iter(loader), iter(enumerate(loader))
        while True:
            try:
                {draws}
            except StopIteration:
                break
            opt.zero_grad()
            loss = F.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            opt.step()
            if step % 10 == 0:
                print(step)
    """
    codes = _codes(source)
    assert "GFY101" not in codes and "GFY006" not in codes, codes


def test_a_counter_a_function_declares_global_is_a_per_step_host_value():
    """`global skipped` then `skipped += 1` in the step: the module binds it (a host int) and the loop changes
    it every step, as when the loop stands at module level (GFY701)."""
    source = """
    skipped = 0

    def train(model, loader, opt):
        global skipped
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            loss = F.cross_entropy(model(x), y)
            skipped += 1
            opt.zero_grad()
            (loss * skipped).backward()
            opt.step()
    """
    [loop] = _train_loops(_outcomes(source))
    assert (not loop.rewritten or loop.model_only) and "GFY701" in _codes(source), loop.reasons


# ---- 5. the loop that trains is found ------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["optimizer", "opt_", "adamw"])
def test_a_loop_stepping_through_a_scaler_object_is_found_whatever_the_optimizer_is_called(optimizer):
    """`loss_scaler(loss, opt_)`, whose class's `__call__` runs backward and the step: the loop trains."""
    source = f"""
    class LossScaler:
        def __init__(self):
            self._scaler = torch.cuda.amp.GradScaler()

        def __call__(self, loss, opt):
            self._scaler.scale(loss).backward()
            self._scaler.step(opt)
            self._scaler.update()

    def train(model, loader):
        {optimizer} = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_scaler = LossScaler()
        for x, y in loader:
            loss = F.cross_entropy(model(x.cuda()), y.cuda())
            {optimizer}.zero_grad()
            loss_scaler(loss, {optimizer})
    """
    assert [loop.kind for loop in _outcomes(source).outcomes] == ["train"]


def test_the_step_loop_is_found_beside_a_flush_after_it():
    source = """
    def train(model, loader, accum, epochs):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(epochs):
            for i, (x, y) in enumerate(loader):
                loss = F.cross_entropy(model(x.cuda()), y.cuda()) / accum
                loss.backward()
                if (i + 1) % accum == 0:
                    opt.step()
                    opt.zero_grad()
            if len(loader) % accum:
                opt.step()
                opt.zero_grad()
    """
    result = _outcomes(source)
    [loop] = result.outcomes
    assert loop.line == 1 + _HEADER.count("\n") + 4 and loop.rewritten, loop


def test_a_loss_returned_by_a_method_of_the_same_class_is_a_tensor():
    """`loss = self.training_step(batch)`: its return value is what that method returns, a tensor, so
    `float(loss)` reads it on the host (GFY005) as `loss.item()` would (GFY001)."""
    source = """
    class Trainer:
        def __init__(self, model, opt, loader):
            self.model, self.opt, self.loader, self.history = model, opt, loader, []

        def training_step(self, batch):
            x, y = batch
            loss = F.cross_entropy(self.model(x.cuda()), y.cuda())
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            return loss

        def fit(self):
            for batch in self.loader:
                loss = self.training_step(batch)
                self.history.append(float(loss))
    """
    assert "GFY005" in _codes(source)


# ---- 6. model calls through helpers -------------------------------------------------------------

_HELPER_CALL = """
def forward_(module, *args, **kwargs):
    return module(*args, **kwargs)


def call_model(module, inputs):
    {helper_body}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 1)

    def forward(self, x):
        {forward_body}
        return self.fc(x)


def main(loader):
    device = torch.device("cuda")
    net_ = Net().to(device)
    opt = torch.optim.SGD(net_.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss({call}, y)
        if loss.item() > 100:
            continue
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

_CALLS = ["net_(x)", "forward_(net_, x)", "call_model(net_, x)", "call_model(inputs=x, module=net_)"]


@pytest.mark.parametrize("call", _CALLS)
def test_a_model_called_through_a_helper_has_its_forward_checked(call):
    """Arguments forwarded by `*args`/`**kwargs` or by keyword reach the model's forward as what the loop
    passed: a branch on a tensor value there is found, however the model is called."""
    source = _HELPER_CALL.format(call=call, helper_body="return module(inputs)", forward_body="x = x * 2 if x.sum() > 0 else x")
    assert "GFY101" in {
        d.code for d in analyze_source(_HEADER + textwrap.dedent(source), "train.py", Settings()).diagnostics if d.line > 30
    }


@pytest.mark.parametrize("call", _CALLS)
def test_a_model_called_through_a_helper_is_graphed_alone(call):
    source = _HELPER_CALL.format(call=call, helper_body="return module(inputs)", forward_body="x = x * 2")
    result = _outcomes(source)
    (loop,) = _train_loops(result)
    assert loop.rewritten and loop.model_only, loop.partial_refusal
    assert call.replace("net_", "graphed_net_") in result.code


def test_a_helper_that_sets_the_models_mode_is_handed_the_graphed_model():
    """The graphed model answers attribute reads as the model (`module.train()`, `module.training`)."""
    source = _HELPER_CALL.format(
        call="call_model(net_, x)", helper_body="module.train()\n    return module(inputs)", forward_body="x = x * 2"
    )
    result = _outcomes(source)
    (loop,) = _train_loops(result)
    assert loop.rewritten and loop.model_only, loop.partial_refusal
    assert "call_model(graphed_net_, x)" in result.code


@pytest.mark.parametrize("use", ["print(isinstance(module, nn.Module))", "seen.append(module)", "other = module"])
def test_a_helper_that_passes_the_model_on_or_keeps_it_keeps_it_eager(use):
    """Handed on, stored or tested, the model would be the wrapper there."""
    source = _HELPER_CALL.format(call="call_model(net_, x)", helper_body=f"{use}\n    return module(inputs)", forward_body="x = x * 2")
    (loop,) = _train_loops(_outcomes(source.replace("def call_model", "seen = []\n\n\ndef call_model")))
    assert not loop.rewritten
    assert "`module` only called in `call_model`" in loop.partial_refusal


def test_host_data_built_in_a_helper_after_its_model_call_is_no_step_input():
    """Called functions run inside the step from where they are called: a tensor built from numpy after the
    model call of the same helper is frozen by capture (GFY201 blocking), not an input prepared before it."""
    source = """
    def train_step(model, opt, xb, yb):
        logits = model(xb)
        noise = torch.from_numpy(np.random.randn(*logits.shape)).float().cuda()
        loss = F.cross_entropy(logits + noise, yb)
        opt.zero_grad()
        loss.backward()
        opt.step()


    def main(loader):
        model = nn.Linear(2, 5).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for xb, yb in loader:
            train_step(model, opt, xb.cuda(), yb.cuda())
    """
    report = analyze_source(_HEADER + textwrap.dedent(source), "train.py", Settings())
    (loop,) = report.loops
    assert loop.verdict.value == "partially-capturable"  # the model, handed to the helper, is graphed alone
    assert {"GFY201", "GFY702"} <= set(loop.reasons)


# ---- 7. a tensor moved earlier in the iteration is on the device ---------------------------------

_MOVED_EARLIER = """
def train(model, loader, opt, device):
    for x, y in loader:
        x = x.float().to(device)
        y = {y_binding}
        {line}
        loss = model(x, z).sum() + y.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize(
    "line",
    [
        "z = y[:, :3].to(device)",
        "z = torch.cat([y[:, :2], x], dim=1).float().to(device)",
        "z = torch.sigmoid(torch.zeros_like(y)).cuda()",
        "z = y.detach().clone().to(device)",
    ],
)
def test_moving_a_tensor_moved_earlier_in_the_iteration_copies_nothing(line):
    source = _MOVED_EARLIER.format(y_binding="y.to(device)", line=line)
    report = analyze_source(_HEADER + textwrap.dedent(source), "train.py", Settings())
    assert [d.line for d in report.diagnostics if d.code == "GFY301"] == [9, 10]  # x and y: the batch's own copies


def test_a_tensor_still_on_the_host_is_copied_whatever_came_before():
    source = _MOVED_EARLIER.format(y_binding="y.float()", line="z = torch.cat([y[:, :2], x], dim=1).to(device)")
    report = analyze_source(_HEADER + textwrap.dedent(source), "train.py", Settings())
    assert [d.line for d in report.diagnostics if d.code == "GFY301"] == [9, 11]


# ---- 2. (cont.) branches on values fixed for the run: every test of an if/elif chain keys the graph -----

_BRANCHED_STEP = """
def train(model, loader, opt, args, device):
    counted = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        if args.decoder == "attention":
            counted += 1
            out = model(x)
            target = y
        {alternatives}
        loss = F.mse_loss(out, target)
        loss.backward()
        opt.step()
"""

_ALTERNATIVES = {
    "elif_else": 'elif args.decoder == "fc":\n            out = model(x) * 2\n            target = y\n        else:\n            out = model(x) + 1\n            target = {"t": y}["t"]',
    "else_binding": 'else:\n            out = model(x) + 1\n            target = {"t": y}["t"]',
}


@pytest.mark.parametrize("name", sorted(_ALTERNATIVES))
def test_every_test_of_a_branch_chain_keys_the_graph(name):
    result = _outcomes(_BRANCHED_STEP.format(alternatives=_ALTERNATIVES[name]))
    (loop,) = _train_loops(result)
    assert loop.rewritten and not loop.model_only, loop.reasons
    tests = '(args.decoder == "attention", args.decoder == "fc",)' if name == "elif_else" else '(args.decoder == "attention",)'
    assert f"key={tests}" in result.code


@pytest.mark.parametrize("name", sorted(_ALTERNATIVES))
def test_host_statements_split_off_a_branch_run_once_and_bindings_the_step_reads_stay_in_it(name):
    code = _outcomes(_BRANCHED_STEP.format(alternatives=_ALTERNATIVES[name])).code
    replay = code[code.index("key=") :]
    assert 'if args.decoder == "attention":\n            counted += 1\n' in replay  # the counter runs after the replay
    assert "model(x)" not in replay  # and no branch's GPU work runs again there
    step = code[code.index("def train_step") : code.index("key=")]
    assert "target = y" in step and "counted" not in step


def test_a_list_of_records_built_by_the_function_holds_no_tensors():
    """`for phase in phases` over dicts the function appended (a StyleGAN-style phase list): a test on
    `phase["name"]` is a host branch, not a tensor one; what blocks is that each phase is another step."""
    source = """
    def training_loop(G, D, loader, device):
        phases = []
        for name, module in [("G", G), ("D", D)]:
            phases.append(dict(name=name, module=module, opt=torch.optim.Adam(module.parameters())))
        for real, _ in loader:
            real = real.to(device)
            for phase in phases:
                phase["opt"].zero_grad(set_to_none=True)
                z = torch.randn(real.shape[0], 512, device=device)
                loss = phase["module"](z).mean() if phase["name"] == "G" else D(real).mean()
                loss.backward()
                phase["opt"].step()
    """
    codes = _codes(source)
    assert "GFY103" not in codes and "GFY701" in codes


@pytest.mark.parametrize("call", ["model.encode(x)", "model.backbone(x)", "model.log_probs(x)", "model.forward(x)"])
def test_a_model_method_or_submodule_that_runs_it_is_a_model_call(call):
    """An inference loop whose step calls a model's method (not its `__call__`) is found and captured."""
    source = f"""
    def evaluate(model, loader, device):
        model.eval()
        outs = []
        with torch.no_grad():
            for x, _ in loader:
                x = x.to(device)
                outs.append({call})
        return outs
    """
    result = _outcomes(source)
    assert [(o.kind, o.rewritten) for o in result.outcomes] == [("inference", True)]
    # appended inline: captured as an output, appended after the replay, as a copy the next replay keeps
    assert "outs_item = inference_step.copy(outs_item)\n            outs.append(outs_item)" in result.code


@pytest.mark.parametrize("call", ["model.to(device)", "model.parameters()", "tokenizer.batch_decode(x)", "d.startswith('a')"])
def test_upkeep_tokenizers_and_strings_are_no_model_calls(call):
    source = f"""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")

    def evaluate(model, loader, device, d):
        with torch.no_grad():
            for x, _ in loader:
                {call}
    """
    assert not analyze_source(_HEADER + textwrap.dedent(source), "train.py", Settings()).loops


def test_an_evaluation_loop_whose_caller_turns_gradients_off_is_an_inference_loop():
    """`with torch.no_grad(): val = evaluate(model, loader)`: the loop in `evaluate` is found; a loop over a
    model's layers in a method called so is a forward pass, not a loop of steps."""
    source = """
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x


    def evaluate(model, loader, device):
        total = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            total += F.mse_loss(model(x), y).item()
        return total / len(loader)


    def main(loader, device):
        model = Stack().to(device)
        with torch.no_grad():
            print(evaluate(model, loader, device))
    """
    report = analyze_source(_HEADER + textwrap.dedent(source), "train.py", Settings())
    assert [(lp.kind, lp.line) for lp in report.loops] == [("inference", 20)]


@pytest.mark.parametrize(
    "container",
    ["nn.ModuleList([Act() for _ in range(3)])", "nn.Sequential(Act(), Act())", "nn.ModuleList([Act(), Act()])"],
)
def test_a_layer_of_a_container_of_modules_is_followed_into_its_forward(container):
    """`for level in self.levels: x = level(x)` runs the forward of the class the container holds: a branch
    there on a buffer `register_buffer` made (ActNorm's `if not self.initialized`) is a tensor branch, and
    the buffer's in-place update is device work, not host state."""
    source = f"""
    class Act(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("initialized", torch.tensor(0).byte())
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            if not self.initialized:
                self.initialized += 1
            return self.lin(x)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.levels = {container}

        def forward(self, x):
            for level in self.levels:
                x = level(x)
            return x


    def train(loader):
        model = Net().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """
    codes = _codes(source)
    assert "GFY101" in codes and "GFY703" not in codes


def test_models_from_define_factories_and_losses_moved_to_the_device_are_known():
    """pix2pix's `net_g = define_G(...)` builds a model, and `criterionGAN = GANLoss().to(device)` is still a
    loss after `.to()`: calling it is the step's loss, not a host call with unknown effects (GFY701)."""
    source = """
    from networks import GANLoss, define_D, define_G

    def train(loader, device):
        net_g = define_G(3, 3, 64).to(device)
        net_d = define_D(6, 64).to(device)
        criterionGAN = GANLoss().to(device)
        optimizer_g = torch.optim.SGD(net_g.parameters(), lr=0.1)
        optimizer_d = torch.optim.SGD(net_d.parameters(), lr=0.1)
        for real_a, real_b in loader:
            real_a, real_b = real_a.to(device), real_b.to(device)
            fake_b = net_g(real_a)
            optimizer_d.zero_grad()
            loss_d = criterionGAN(net_d.forward(torch.cat((real_a, fake_b.detach()), 1)), False)
            loss_d.backward()
            optimizer_d.step()
            optimizer_g.zero_grad()
            loss_g = criterionGAN(net_d.forward(torch.cat((real_a, fake_b), 1)), True)
            loss_g.backward()
            optimizer_g.step()
    """
    (loop,) = _train_loops(_outcomes(source))
    assert loop.rewritten and not loop.model_only, loop.reasons


# ---- 3b. host bookkeeping inside a mode block ---------------------------------------------------

_MODE_BLOCKS = {  # block -> the loop it stands in: an evaluation under no_grad, or a training step
    "torch.no_grad()": "evaluate",
    "torch.inference_mode()": "evaluate",
    'torch.no_grad(), torch.autocast("cuda")': "evaluate",
    'torch.autocast("cuda", dtype=torch.bfloat16)': "train",
    "torch.cuda.amp.autocast(enabled=use_amp)": "train",
}

_BOOKKEEPING_IN_BLOCK = {
    "meter": "meter.update(loss.item(), x.size(0))",
    "list": "losses.append(loss.item())",
    "print": 'print(f"loss {loss.item():.3f}")',
}

_LOOP_WITH_BLOCK = """
def {kind}(model, loader, opt, device, use_amp=True):
    meter, losses = Meter(), []
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with {block}:
            loss = F.cross_entropy(model(x), y)
            {bookkeeping}
{rest}    return meter.avg, losses
"""


@pytest.mark.parametrize("block", sorted(_MODE_BLOCKS))
@pytest.mark.parametrize("bookkeeping", sorted(_BOOKKEEPING_IN_BLOCK))
def test_host_bookkeeping_inside_a_mode_block_moves_after_the_replay(block, bookkeeping):
    """`with torch.no_grad(): loss = ...; meter.update(loss.item())`: the block only sets modes, so the
    bookkeeping leaves the step as it would outside the block, and runs in the same block after it."""
    kind = _MODE_BLOCKS[block]
    rest = "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n" if kind == "train" else ""
    source = _LOOP_WITH_BLOCK.format(kind=kind, block=block, bookkeeping=_BOOKKEEPING_IN_BLOCK[bookkeeping], rest=rest)
    result = _outcomes(_METER.replace("AverageMeter", "Meter") + source)
    [loop] = result.outcomes
    assert loop.rewritten and not loop.model_only, loop.reasons
    step, after_call = result.code.split(f"= {loop.step_name}(", 1)
    assert f"with {block}:\n            loss = F.cross_entropy(model(x), y)\n" in step
    assert f"with {block}:\n" in after_call and "loss.item()" in after_call and "loss.item()" not in step


def test_a_mode_block_with_nothing_to_move_reads_as_the_source():
    source = """
    def train(model, loader, opt, device):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
                # the loss in the same precision
                loss = F.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """
    result = _outcomes(source)
    [loop] = _train_loops(result)
    assert loop.rewritten
    assert (
        '        with torch.autocast("cuda", dtype=torch.bfloat16):\n'
        "            out = model(x)\n"
        "            # the loss in the same precision\n"
        "            loss = F.cross_entropy(out, y)\n"
        "        opt.zero_grad()\n"
    ) in result.code


def test_a_context_that_is_not_a_mode_stays_whole():
    """`with model.no_sync():` changes what the backward does (no gradient all-reduce): not opened."""
    source = """
    def train(model, loader, opt, device):
        losses = []
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with model.no_sync():
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                losses.append(loss.item())
            opt.step()
    """
    [loop] = _train_loops(_outcomes(source))
    assert not loop.rewritten or loop.model_only


# ---- 3c. an `else:` that leaves the loop is a guard --------------------------------------------

_GUARDED = """
def evaluate(model, loader, device, num_batches):
    total = 0.0
    for i, (x, y) in enumerate(loader):
{body}
    return total / num_batches
"""

_GUARDED_STEP = """
x, y = x.to(device), y.to(device)
with torch.no_grad():
    loss = F.cross_entropy(model(x), y)
total += loss.item()"""

_GUARDS = {
    f"if-else-{exit.split()[0]}": f"if i < num_batches:{textwrap.indent(_GUARDED_STEP, '    ')}\nelse:\n    {exit}"
    for exit in ("break", "continue", "return total / num_batches")
}
_GUARDS["if-not-break"] = f"if not (i < num_batches):\n    break{_GUARDED_STEP}"


@pytest.mark.parametrize("name", sorted(_GUARDS))
def test_a_branch_whose_else_leaves_the_loop_is_a_guard(name):
    """`if i < n: <step> else: break` means `if not i < n: break` then the step: the same verdict, codes
    and rewrite as the guard spelled out (no host value frozen, no GPU work under a host condition)."""
    source = _GUARDED.format(body=textwrap.indent(textwrap.dedent(_GUARDS[name]), " " * 8))
    [loop] = _outcomes(source).outcomes
    assert loop.rewritten and not loop.model_only, loop.reasons
    assert _codes(source) == _codes(_GUARDED.format(body=textwrap.indent(textwrap.dedent(_GUARDS["if-not-break"]), " " * 8)))


def test_a_device_a_helper_reads_from_the_module_is_the_loops_device():
    """`calc_loss_batch` moves the batch to the module's `device`: the step's inputs go there too."""
    source = """
    device = torch.device("cuda")

    def calc_loss_batch(model, x, y):
        x, y = x.to(device), y.to(device)
        return F.cross_entropy(model(x), y)

    def train(model, loader, opt):
        for x, y in loader:
            opt.zero_grad()
            loss = calc_loss_batch(model, x, y)
            loss.backward()
            opt.step()
    """
    result = _outcomes(source)
    [loop] = _train_loops(result)
    assert loop.rewritten and not loop.model_only, loop.reasons
    assert "CapturedStep(train_step, device=device)" in result.code


def test_a_loop_that_calls_a_function_whose_loop_is_rewritten_is_no_step_loop():
    """The epoch loop around `train_one_epoch` of a rewritten file: its steps replay in that function's
    loop, and a function defined there runs when called, not where it is defined."""
    source = """
    from graphify.runtime import CapturedStep

    def train_one_epoch(model, loader, opt, device):
        def train_step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            return loss
        train_step = CapturedStep(train_step)
        for x, y in loader:
            loss = train_step(x, y)
        return loss

    def main(model, loader, opt, device):
        for epoch in range(3):
            last = train_one_epoch(model, loader, opt, device)
            print(last.item())
    """
    result = _outcomes(source)
    assert not any(o.rewritten for o in result.outcomes), result.outcomes


# ---- a GradScaler step in one branch of a host condition ---------------------------------------

_SCALER_BRANCHES = {
    "step-update": """
        if use_amp:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()""",
    "unscale-clip": """
        if use_amp:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()""",
    "config-attribute": """
        if cfg.use_amp:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()""",
}

_SCALER_LOOP = """
def train(model, loader, opt, device, cfg, use_amp=True):
    scaler = torch.cuda.amp.GradScaler(enabled=use_amp)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16, enabled=use_amp):
            loss = F.cross_entropy(model(x), y)
{branch}
"""


@pytest.mark.parametrize("name", sorted(_SCALER_BRANCHES))
def test_a_scaler_step_in_a_branch_of_a_host_condition_runs_eagerly_after_the_replay(name):
    """`if use_amp: scaler.scale(loss).backward(); scaler.step(opt) ... else: loss.backward(); opt.step()`:
    one graph per outcome, and in the scaler's branch the scaler's step runs after the replay, under the
    same test, as it does after an unbranched scaled backward."""
    branch = textwrap.indent(textwrap.dedent(_SCALER_BRANCHES[name]), " " * 8)
    result = _outcomes(_SCALER_LOOP.format(branch=branch))
    [loop] = _train_loops(result)
    assert loop.rewritten and not loop.model_only, loop.reasons
    step, after_call = result.code.split("# graphify: replay the captured step", 1)
    test = "cfg.use_amp" if name == "config-attribute" else "use_amp"
    assert f"key=({test},)" in after_call.splitlines()[1]
    assert "scaler.scale(loss).backward()" in step and "opt.step()" in step and "scaler.step(opt)" not in step
    assert f"if {test}:\n" in after_call and "scaler.step(opt)" in after_call and "else:" not in after_call


@pytest.mark.parametrize(
    "branch",
    [
        # the scaler steps before its branch's backward
        "if use_amp:\n    scaler.step(opt)\n    scaler.scale(loss).backward()\nelse:\n    loss.backward()\n    opt.step()",
        # the scaler in the `else`: the graph of that outcome would end at a scaler call
        "if not use_amp:\n    loss.backward()\n    opt.step()\nelse:\n    scaler.scale(loss).backward()\n    scaler.step(opt)",
    ],
)
def test_a_scaler_branch_the_split_cannot_follow_stays_refused(branch):
    result = _outcomes(_SCALER_LOOP.format(branch=textwrap.indent(branch, " " * 8)))
    [loop] = _train_loops(result)
    assert not loop.rewritten or loop.model_only
    assert "GFY706" in loop.reasons or loop.model_only


def test_host_statements_of_every_branch_of_a_keyed_if_run_after_the_replay():
    """`if use_amp: with autocast(): <forward>; losses.append(loss.item()) else: <forward>; losses.append(...)`:
    each branch keeps its GPU work in the graph of its outcome; its bookkeeping runs after the replay under
    the same test (the `with` block too), in the `else` as in the `if`."""
    source = """
    def train(model, loader, opt, device, use_amp):
        losses, plain_steps = [], 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            if use_amp:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = model(x)
                    loss = F.mse_loss(out.float(), y)
                    losses.append(loss.item())
            else:
                out = model(x)
                loss = F.mse_loss(out, y)
                losses.append(loss.item())
                plain_steps += 1
            loss.backward()
            opt.step()
        return losses, plain_steps
    """
    result = _outcomes(source)
    [loop] = _train_loops(result)
    assert loop.rewritten and not loop.model_only, loop.reasons
    step = result.code.split("def train_step(", 1)[1].split("train_step = CapturedStep", 1)[0]
    assert ".item()" not in step and "plain_steps" not in step and "else:" in step
    moved = result.code.split("# graphify: replay the captured step", 1)[1].split("\n", 2)[2]
    assert moved.startswith(
        "        if use_amp:\n"
        '            with torch.autocast("cuda", dtype=torch.bfloat16):\n'
        "                losses.append(loss.item())\n"
        "        else:\n"
        "            losses.append(loss.item())\n"
        "            plain_steps += 1\n"
    ), moved


def test_host_statements_of_builtins_and_a_branch_rebinding_an_input_stay_in_the_step():
    """The siamese-network trainer: `if type(outputs) not in (tuple, list): outputs = (outputs,)` calls only
    builtins that change nothing (computed once per graph), and `if target is not None: target = (target,)`
    rebinds an input: on the steps that skip it, the step returns the target it was handed."""
    source = """
    def train_epoch(train_loader, model, loss_fn, optimizer, cuda):
        losses = []
        for batch_idx, (data, target) in enumerate(train_loader):
            target = target if len(target) > 0 else None
            if not type(data) in (tuple, list):
                data = (data,)
            if cuda:
                data = tuple(d.cuda() for d in data)
                if target is not None:
                    target = target.cuda()
            optimizer.zero_grad()
            outputs = model(*data)
            if type(outputs) not in (tuple, list):
                outputs = (outputs,)
            loss_inputs = outputs
            if target is not None:
                target = (target,)
                loss_inputs += target
            loss_outputs = loss_fn(*loss_inputs)
            loss = loss_outputs[0] if type(loss_outputs) in (tuple, list) else loss_outputs
            losses.append(loss.item())
            loss.backward()
            optimizer.step()
        return losses
    """
    result = _outcomes(source)
    [loop] = _train_loops(result)
    assert loop.rewritten and not loop.model_only, loop.reasons
    assert "key=(target is not None,)" in result.code


@pytest.mark.parametrize("name", ["d", "g", "t"])
def test_a_short_loop_variable_is_no_model_by_its_name(name):
    """`tuple(d.cuda() for d in data)`: a lowercase `d` is no discriminator; its copy is a per-step copy."""
    source = f"""
    def train(model, loader, opt):
        for data, target in loader:
            data = tuple({name}.cuda() for {name} in data)
            opt.zero_grad()
            loss = F.mse_loss(model(*data), target.cuda())
            loss.backward()
            opt.step()
    """
    report = analyze_source(_HEADER + textwrap.dedent(source), "train.py", Settings())
    assert sum(d.code == "GFY301" for d in report.diagnostics) == 2


# ---- host I/O told by what makes the object or names the function ----------------------------------

_IO_LOOP = """
{imports}

def train(model, loader, opt, device, total):
    {setup}
    global_step = 0
    for x, y in {loader}:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        global_step += 1
        {io}
"""

# (imports, setup, the loop's iterable, the I/O statement, the code it is told by)
_HOST_IO = {
    "progress_bar_named_freely": (
        "",
        "epoch_iterator = tqdm(loader)",
        "epoch_iterator",
        'epoch_iterator.set_description("%d / %d" % (global_step, total))',
        "GFY511",
    ),
    "progress_bar_update": ("", "bar = tqdm(total=total)", "loader", "bar.update(1)", "GFY511"),
    "progress_bar_in_place_of_the_loader": ("", "loader = tqdm(loader)", "loader", 'loader.set_postfix_str("lr")', "GFY511"),
    "writer_of_a_library": (
        "from tensorboardX import SummaryWriter",
        "sw = SummaryWriter()",
        "loader",
        "sw.add_audio('x', x, global_step)",
        "GFY511",
    ),
    "logger_class_of_a_sibling_module": (
        "from utils.logger import Logger",
        "lg = Logger('runs')",
        "loader",
        "lg.scalar_summary('loss', 1.0, global_step)",
        "GFY511",
    ),
    "reporting_helper_of_a_sibling_module": ("from utils.tools import visual", "", "loader", "visual(y, x, 'out.pdf')", "GFY511"),
    "log_helper_of_a_sibling_module": ("from utils import log", "", "loader", "log(None, global_step, losses=2.0)", "GFY511"),
    "saving_helper_of_a_module": ("import utils", "", "loader", "utils.saveimg(x, 'sample.png')", "GFY512"),
    "image_saved_by_pil": ("from PIL import Image", "", "loader", "Image.fromarray(np.zeros((2, 2))).save('a.png')", "GFY512"),
    "figure_saved": ("import matplotlib.pyplot as plt", "", "loader", "plt.savefig('loss.png')", "GFY512"),
}


def _io_loop(case: str) -> str:
    imports, setup, loader, io, _ = _HOST_IO[case]
    return _IO_LOOP.format(imports=imports, setup=setup or "pass", loader=loader, io=io)


@pytest.mark.parametrize("case", sorted(_HOST_IO))
def test_host_io_is_told_by_what_made_the_object_or_names_the_function(case):
    assert _HOST_IO[case][-1] in _codes(_io_loop(case))


@pytest.mark.parametrize("case", sorted(_HOST_IO))
def test_host_io_moves_after_the_replay_and_freezes_nothing(case):
    """What only a progress bar, a logger or a file reads (`global_step` in a description) is no value the
    step reads: the step is captured whole, the I/O runs after each replay."""
    source = _io_loop(case)
    assert not _codes(source) & {"GFY701", "GFY703", "GFY706"}
    loops = _train_loops(_outcomes(source))
    assert [(o.rewritten, o.model_only) for o in loops] == [(True, False)]


@pytest.mark.parametrize(
    "statement",
    [
        "img = plot_spectrogram_to_numpy(x)",  # its result is used: it computes
        "lp = log_prob(x)",
        "z = log(2.0)",
        "MetricLogger().update(loss=1.0)",  # a class of this file: its body decides
    ],
)
def test_a_call_that_computes_is_not_host_io_by_its_name(statement):
    source = """
from utils import plot_spectrogram_to_numpy, log_prob
from math import log


class MetricLogger:
    def __init__(self):
        self.totals = {}

    def update(self, **values):
        for name, value in values.items():
            self.totals[name] = self.totals.get(name, 0.0) + value
""" + _IO_LOOP.format(imports="", setup="pass", loader="loader", io=statement)
    assert not _codes(source) & {"GFY511", "GFY512"}


# ---- an LR set between the backward and the optimizer's step runs before the whole step ----------------

_LR_BETWEEN = """
def train(model, loader, opt, scheduler, device):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        {lr}
        opt.step()
        print(loss.item())
"""

_SETTING_LR = {
    "scheduler_step": "scheduler.step()",
    "scheduler_step_if_any": "if scheduler is not None:\n            scheduler.step()",
    "lr_scheduler_named": "lr_sched.step()",
    "param_groups_by_hand": "for g in opt.param_groups:\n            g['lr'] = 0.1",
}


@pytest.mark.parametrize("name", sorted(_SETTING_LR))
def test_an_lr_set_between_backward_and_optimizer_step_runs_before_the_replay(name):
    """Only the optimizer's step reads the learning rate: set before the whole step, the replayed step
    uses the rate set for this batch, as the source does."""
    source = _LR_BETWEEN.format(lr=_SETTING_LR[name]).replace("scheduler, device", "scheduler, device, lr_sched=None")
    result = _outcomes(source)
    assert [(o.rewritten, o.model_only) for o in _train_loops(result)] == [(True, False)]
    code = result.code
    setting = "g['lr']" if name == "param_groups_by_hand" else ".step()"
    assert code.index(setting, code.index("for x, y in loader")) < code.index("train_step(x, y)", code.index("for x, y in loader"))


@pytest.mark.parametrize("call", ["scheduler.step(loss)", "noise_scheduler.step(loss, 1, x)"])
def test_a_scheduler_step_fed_the_steps_values_is_not_moved_before_it(call):
    result = _outcomes(_LR_BETWEEN.format(lr=call).replace("scheduler, device", "scheduler, device, noise_scheduler=None"))
    assert [o.rewritten and not o.model_only for o in _train_loops(result)] == [False]


# ---- gradients unset by hand in the step are zero_grad(set_to_none=True) ----------------------------

_UNSET_IN_HELPER = """
def train_batch(model, opt, x, y):
    {unset}
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def train(model, loader, opt, device, accumulate):
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        {call}
        print(loss.item())
"""

_UNSETS = {
    "every_parameter": "for p in model.parameters():\n        p.grad = None",
    "named_parameters": "for _, p in model.named_parameters():\n        p.grad = None",
    "one_tensor": "model.weight.grad = None",
}


@pytest.mark.parametrize("name", sorted(_UNSETS))
def test_gradients_unset_by_hand_inside_the_step_are_captured_with_it(name):
    source = _UNSET_IN_HELPER.format(unset=_UNSETS[name], call="loss = train_batch(model, opt, x, y)")
    assert "GFY703" not in _codes(source)
    assert [(o.rewritten, o.model_only) for o in _train_loops(_outcomes(source))] == [(True, False)]


def test_gradients_unset_by_hand_in_a_keyed_step_stay_refused():
    """Graphs keyed on a host condition share their gradients, kept zeroed rather than unset."""
    source = _UNSET_IN_HELPER.replace("    opt.step()\n", "").format(
        unset=_UNSETS["every_parameter"],
        call="loss = train_batch(model, opt, x, y)\n        if (i + 1) % accumulate == 0:\n            opt.step()",
    )
    loops = _train_loops(_outcomes(source))
    assert [(o.rewritten and not o.model_only, o.reasons) for o in loops] == [(False, ["GFY703"])]


# ---- modules run through containers are read like modules called by name ------------------------------

_CONTAINED = """
class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("initialized", torch.tensor(0).byte())
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x):
        if not self.initialized:
            self.initialized += 1
        return x * self.scale


class Plain(nn.Module):
    def forward(self, x):
        return x * 2

{container}

def train(loader, device):
    model = Net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

_CONTAINERS = {
    "sequential_called_whole": """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(8, 8), Plain(), {module}(), nn.ReLU())

    def forward(self, x):
        return self.main(x)
""",
    "module_list_of_mixed_layers": """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), Plain(), {module}()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
""",
    "sequential_subclass_iterating_itself": """
class Chain(nn.Sequential):
    def forward(self, x):
        for module in self:
            x = module(x)
        return x


class Step(Chain):
    def __init__(self):
        super().__init__(nn.Linear(8, 8), {module}())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.steps = Chain(*[Step() for _ in range(2)])

    def forward(self, x):
        return self.steps(x)
""",
    "six_calls_deep": """
class L5(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = {module}()

    def forward(self, x):
        return self.inner(x)


class L4(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = L5()

    def forward(self, x):
        return self.inner(x)


class L3(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = L4()

    def forward(self, x):
        return self.inner(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = L3()

    def forward(self, x):
        return self.log_prob(x)

    def log_prob(self, x):
        return self.inner(x)
""",
}


@pytest.mark.parametrize("name", sorted(_CONTAINERS))
def test_a_module_run_through_a_container_is_read(name):
    flagged = _CONTAINED.format(container=_CONTAINERS[name].format(module="Norm"))
    clean = _CONTAINED.format(container=_CONTAINERS[name].format(module="Plain"))
    assert "GFY101" in _codes(flagged)
    assert [o.rewritten and not o.model_only for o in _train_loops(_outcomes(flagged))] == [False]
    assert "GFY101" not in _codes(clean)
    assert [(o.rewritten, o.model_only) for o in _train_loops(_outcomes(clean))] == [(True, False)]


# ---- nested functions read their enclosing function; what an optimizer trains is a model --------------

_NESTED_UPDATE = """
def run(loader, device, make_policy):
    agent = make_policy()
    pi_optimizer = torch.optim.Adam(agent.pi.parameters(), lr=1e-3)

    def compute_loss(x, y):
        return F.mse_loss(agent.pi(x), y)

    def update():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            pi_optimizer.zero_grad()
            loss = compute_loss(x, y)
            loss.backward()
            pi_optimizer.step()
            print(loss.item())

    update()
"""


def test_a_loop_in_a_nested_function_follows_the_functions_defined_beside_it():
    """`compute_loss` is defined in `run`, beside `update`; `agent` is a model because an optimizer trains
    its submodule's parameters, whatever it is called or made by."""
    assert "GFY706" not in _codes(_NESTED_UPDATE)
    assert [(o.rewritten, o.model_only) for o in _train_loops(_outcomes(_NESTED_UPDATE))] == [(True, False)]


@pytest.mark.parametrize("name", ["unmix", "separator_", "f"])
def test_an_object_an_optimizer_trains_is_a_model_whatever_its_name(name):
    source = f"""
def train(loader, device, build):
    {name} = build()
    opt = torch.optim.SGD({name}.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = F.mse_loss({name}(x), y)
        loss.backward()
        opt.step()
"""
    assert [(o.rewritten, o.model_only) for o in _train_loops(_outcomes(source))] == [(True, False)]
