"""Control flow and bindings the whole-step planner must not move or miss: an exit (`break`, `return`)
between captured statements would run after the whole step (one optimizer step too many); an exit
after `zero_grad` must keep it outside; names bound earlier on the same line, by a `with` on one
line, by `match` patterns, by `:=`, or through a loop target that is an item or attribute, are the
step's own or its inputs. Each case is a script whose rewrite, run on the CPU, must print what the
original prints."""

from __future__ import annotations

import textwrap

import pytest
from in_process import printed_by

from graphify.rewrite import rewrite_source

_HEAD = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = [(torch.randn(3, 4), torch.randint(0, 2, (3,))) for _ in range(10)]
"""
_TAIL = """
print("checksum", sum(p.sum().item() for p in model.parameters()))
"""


def _run(code: str, tmp_path) -> str:
    path = tmp_path / "script.py"
    path.write_text(code)
    return printed_by(path)


def _rewritten(body: str, tmp_path):
    script = _HEAD + textwrap.dedent(body) + _TAIL
    result = rewrite_source(script, str(tmp_path / "script.py"))
    assert _run(result.code, tmp_path) == _run(script, tmp_path)
    return result


@pytest.mark.parametrize(
    "body",
    [
        """
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if i >= 6:
                break
            opt.step()
        """,
        """
        def train(max_steps):
            for i, (x, y) in enumerate(data):
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                if i >= max_steps:
                    return loss.item()
                opt.step()

        print(train(6))
        """,
    ],
    ids=["break", "return"],
)
def test_an_exit_between_captured_statements_is_not_moved_past_them(body, tmp_path):
    result = _rewritten(body, tmp_path)
    assert "CapturedStep(" not in result.code and "GFY704" in result.outcomes[0].reasons


def test_an_exit_after_zero_grad_keeps_zero_grad_outside_the_step(tmp_path):
    result = _rewritten(
        """
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            if i >= 6:
                break
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        print([p.grad is None for p in model.parameters()])
        """,
        tmp_path,
    )
    step = result.code.split("def train_step", 1)[1].split("train_step = CapturedStep", 1)[0]
    assert "zero_grad" not in step


@pytest.mark.parametrize(
    "body",
    [
        """
        for x, y in data:
            opt.zero_grad()
            out = model(x); loss = nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
        out = None
        """,
        """
        for x, y in data:
            opt.zero_grad()
            with torch.autocast("cpu", enabled=False): out = model(x); loss = nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
        out = None
        """,
    ],
    ids=["semicolon", "one-line-with"],
)
def test_a_name_bound_earlier_on_the_same_line_is_not_an_input(body, tmp_path):
    """Bound again after the loop, `out` was taken for an input and read before it existed (NameError)."""
    result = _rewritten(body, tmp_path)
    assert "def train_step(x, y):" in result.code


def test_an_assignment_expression_is_refused_whole(tmp_path):
    result = _rewritten(
        """
        for x, y in data:
            opt.zero_grad()
            (loss := nn.functional.cross_entropy(model(x), y)).backward()
            opt.step()
        loss = None
        """,
        tmp_path,
    )
    assert "CapturedStep(" not in result.code and "GFY706" in result.outcomes[0].reasons


def test_names_bound_by_match_patterns_are_inputs(tmp_path):
    result = _rewritten(
        """
        for batch in data:
            match batch:
                case (x, y):
                    pass
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        """,
        tmp_path,
    )
    assert "def train_step(x, y):" in result.code


def test_a_loop_target_that_is_an_item_of_an_object_is_refused(tmp_path):
    """`for cur["x"], cur["y"] in data`: the step would read the batch through `cur`, and a replay would
    train on the batch it was captured with."""
    result = _rewritten(
        """
        cur = {}
        for cur["x"], cur["y"] in data:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(cur["x"]), cur["y"])
            loss.backward()
            opt.step()
        """,
        tmp_path,
    )
    assert "CapturedStep(" not in result.code and "GFY706" in result.outcomes[0].reasons


def test_gradient_accumulation_beside_freezing_is_refused(tmp_path):
    """Accumulation steps keep gradients zeroed (set_to_none=False); a layer frozen later keeps a zero
    gradient, and AdamW's decay and momentum keep moving it, where eager's unset gradient leaves it be."""
    result = _rewritten(
        """
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        for epoch in range(3):
            if epoch == 1:
                model.bias.requires_grad_(False)
            for i, (x, y) in enumerate(data):
                loss = nn.functional.cross_entropy(model(x), y) / 2
                loss.backward()
                if (i + 1) % 2 == 0:
                    opt.step()
                    opt.zero_grad()
        """,
        tmp_path,
    )
    assert "CapturedStep(" not in result.code and "GFY703" in result.outcomes[0].reasons


def test_predictions_collected_inside_the_step_are_appended_after_each_replay(tmp_path):
    """`preds.append(model(x))`: the model call is captured, the append runs after each replay, of a copy
    (captured whole, it would append once, at capture)."""
    result = _rewritten(
        """
        preds = []
        with torch.no_grad():
            for x, _ in data:
                preds.append(model(x))
        print(torch.cat(preds).sum().item())
        """,
        tmp_path,
    )
    assert (
        "CapturedStep(" in result.code and "preds_item = inference_step.copy(preds_item)\n        preds.append(preds_item)" in result.code
    )


def test_a_yield_in_an_inference_loop_is_refused(tmp_path):
    result = _rewritten(
        """
        def predictions():
            with torch.no_grad():
                for x, _ in data:
                    yield model(x).softmax(-1)

        print(sum(p.sum().item() for p in predictions()))
        """,
        tmp_path,
    )
    assert "CapturedStep(" not in result.code and "GFY704" in result.outcomes[0].reasons


@pytest.mark.parametrize(
    "body",
    [
        """
        cell = nn.GRUCell(4, 2)
        opt = torch.optim.SGD(cell.parameters(), lr=0.05)
        h = torch.zeros(3, 2)
        for x, y in data:
            h = cell(x, h.detach())
            loss = nn.functional.cross_entropy(h, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        """,
        """
        def next_batch():
            return data[torch.randint(len(data), ()).item()]

        x, y = next_batch()
        for it in range(8):
            for micro in range(2):
                loss = nn.functional.cross_entropy(model(x), y) / 2
                x, y = next_batch()  # the next batch, fetched while this one's backward is pending
                loss.backward()
            opt.step()
            opt.zero_grad()
        """,
    ],
    ids=["hidden-state", "next-batch-in-micro-steps"],
)
def test_a_value_the_step_binds_for_the_next_step_is_returned(body, tmp_path):
    """Read only by the next step's call: it was neither returned nor rebound outside, so every step
    trained on the first value (the CPU run showed it)."""
    _rewritten(body, tmp_path)
