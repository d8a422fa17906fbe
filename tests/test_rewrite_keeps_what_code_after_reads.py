"""What code around the captured step reads must be what eager code leaves there. Each case is a script
whose rewrite, run on the CPU, must print what the original prints: a comprehension's loop variable is its
own (the same name bound later in the loop body is not an input of the step, which would be read before
it exists); optimizer state read between backward and step is read before the step changes it; outputs
that are views of one another stay views of one another after the copy that keeps them past the next
replay, so an in-place change of one shows in the other."""

from __future__ import annotations

import pytest
from test_step_exits_and_bindings import _rewritten


@pytest.mark.parametrize(
    "body",
    [
        """
        for x, y in data:
            loss = nn.functional.cross_entropy(model(x), y)
            norm = sum((p ** 2).sum() for p in model.parameters())
            opt.zero_grad()
            (loss + 1e-2 * norm).backward()
            opt.step()
            for p in model.parameters():
                print(p.sum().item())
        """,
        """
        weights = {"ce": 1.0, "l1": 0.01}
        for x, y in data:
            losses = {"ce": nn.functional.cross_entropy(model(x), y), "l1": model.weight.abs().mean()}
            loss = sum(weights[k] * v for k, v in losses.items())
            opt.zero_grad()
            loss.backward()
            opt.step()
            for k, v in losses.items():
                print(k, v.item())
        """,
    ],
)
def test_a_comprehension_variable_is_not_an_input_of_the_step(body, tmp_path):
    result = _rewritten(body, tmp_path)
    assert "CapturedStep(" in result.code


def test_optimizer_state_read_before_the_step_is_read_before_it(tmp_path):
    result = _rewritten(
        """
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for x, y in data:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            steps_done = [int(s["step"]) for s in opt.state.values()]
            opt.step()
            print(loss.item(), steps_done)
        """,
        tmp_path,
    )
    assert "CapturedStep(" not in result.code and "GFY704" in result.outcomes[0].reasons, result.outcomes[0].reasons


def test_outputs_that_are_views_of_one_another_stay_so_after_the_copy(tmp_path):
    result = _rewritten(
        """
        for x, y in data:
            out = model(x)
            logits = out.view(-1, 2)
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            probs = logits.detach()
            probs.sigmoid_()
            print(out.sum().item(), probs.sum().item())
        """,
        tmp_path,
    )
    assert "out, logits = train_step.copy((out, logits))" in result.code, result.code
