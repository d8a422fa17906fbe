"""A reason the planner gives about a loop as a whole (no statement of its own to point at) is reported
at the loop's header, so that a loop refused with a code always says why."""

from __future__ import annotations

import textwrap

from click.testing import CliRunner

from graphify.cli import cli

_REGISTRY = """
import torch
import torch.nn as nn
import torch.nn.functional as F


def ce_loss(model, x, y):
    return F.cross_entropy(model(x), y)


LOSSES = {"ce": ce_loss}
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(6, 4), torch.randint(0, 2, (6,))) for _ in range(6)]
loss_fn = LOSSES["ce"]
for x, y in data:
    opt.zero_grad()
    loss = loss_fn(model, x, y)
    loss.backward()
    opt.step()
"""


def test_a_loss_taken_from_a_dict_of_functions_is_refused_with_its_reason_at_the_loop(tmp_path):
    path = tmp_path / "registry.py"
    path.write_text(textwrap.dedent(_REGISTRY))
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 1, result.output
    loop_line = _REGISTRY.splitlines().index("for x, y in data:") + 1
    assert f"registry.py:{loop_line}:1: GFY706 a model call is not seen in the loop body" in result.output, result.output
