"""A statement the whole-step rewrite would move after the step (a host read, a snapshot it does not
feed back) must not read what captured statements after it change in place: the parameters an
optimizer step updates, the gradients clipping rescales. After the whole step it would read the new
values (a logged update norm of 0, a clipped norm logged as the raw one). Nor may it change what the
step runs under (grad mode, the random seed). Each case is a script whose rewrite, run on the CPU, must
print what the original prints; the whole step is refused (GFY704) and the model graphed alone."""

from __future__ import annotations

import pytest
from test_step_exits_and_bindings import _rewritten


@pytest.mark.parametrize(
    "body",
    [
        """
        for x, y in data:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            before = model.weight.detach().clone()
            opt.step()
            print("moved", (model.weight - before).norm().item())
        """,
        """
        for x, y in data:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x) * 50, y)
            loss.backward()
            raw = torch.stack([p.grad.norm() for p in model.parameters()]).norm()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            print("raw norm", raw.item())
        """,
        """
        scales = []
        for x, y in data:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            scales.append(model.bias[0].item())
            opt.step()
        print(scales)
        """,
        """
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            torch.set_grad_enabled(i % 2 == 0)
            out = model(x)
            torch.set_grad_enabled(True)
            loss = nn.functional.cross_entropy(out, y)
            if loss.requires_grad:
                loss.backward()
            opt.step()
        """,
    ],
)
def test_a_read_before_an_in_place_change_is_not_moved_after_it(body, tmp_path):
    result = _rewritten(body, tmp_path)
    assert "CapturedStep(" not in result.code and "GFY704" in result.outcomes[0].reasons, result.outcomes[0].reasons


def test_logging_the_loss_between_backward_and_step_still_captures_the_step(tmp_path):
    """The control: the loss is the step's own value; moving its read after the step changes nothing."""
    result = _rewritten(
        """
        for x, y in data:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            print("loss", loss.item())
            opt.step()
        """,
        tmp_path,
    )
    assert "CapturedStep(" in result.code
