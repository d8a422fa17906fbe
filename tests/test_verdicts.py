"""A loop whose step the rewrite captures is `capturable-after-rewrite` only when nothing it leaves eager
keeps each iteration waiting outside the graph (a collective, a branch on a tensor, a host read that later
GPU work needs); otherwise it is `partially-capturable`, and the rewrite still captures the same step."""

import pytest

from graphify.commands.rewrite_files import loop_notes
from graphify.rewrite import rewrite_source

TEMPLATE = """import torch
import torch.distributed as dist
import torch.nn as nn
device = "cuda"
model = nn.Linear(32, 4).to(device)
model.eval()
correct = []
with torch.no_grad():
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
{body}
"""

WAITING = {
    "collective-after": (
        """\
        pred = model(x).argmax(1)
        dist.all_reduce(pred)""",
        ["GFY611"],
    ),
    "tensor-branch-before": (
        """\
        if (y < 0).any():
            break
        pred = model(x).argmax(1)
        correct.append((pred == y).sum().item())""",
        ["GFY101"],
    ),
    "host-read-feeding-the-device": (
        """\
        probs = model(x).softmax(1)
        token = torch.multinomial(probs, 1)[0].item()
        y.fill_(token)""",
        ["GFY001"],
    ),
}

RUNNING_AHEAD = {
    "host-read-after": """\
        pred = model(x).argmax(1)
        correct.append((pred == y).sum().item())""",
    "seeded-input": """\
        torch.manual_seed(step)
        x = x + 0.1 * torch.randn_like(x)
        pred = model(x).argmax(1)
        correct.append((pred == y).sum().item())""",
    "factory-input": """\
        t = torch.full((x.shape[0], 1), step, device=device)
        pred = model(x + t).argmax(1)
        correct.append((pred == y).sum().item())""",
}


@pytest.mark.parametrize("name", sorted(WAITING))
def test_waiting_left_eager_is_partial(settings, name):
    body, codes = WAITING[name]
    result = rewrite_source(TEMPLATE.format(body=body), "eval.py", settings)
    outcome = result.outcomes[0]
    assert (outcome.verdict.value, outcome.reasons) == ("partially-capturable", codes)
    assert outcome.rewritten and not outcome.model_only
    assert "inference_step = CapturedStep(inference_step)" in result.code
    assert "would capture as `inference_step`" in loop_notes(result, written=False)[0]


@pytest.mark.parametrize("name", sorted(RUNNING_AHEAD))
def test_input_preparation_and_host_reads_left_eager_are_not(settings, name):
    result = rewrite_source(TEMPLATE.format(body=RUNNING_AHEAD[name]), "eval.py", settings)
    outcome = result.outcomes[0]
    assert (outcome.verdict.value, outcome.reasons) == ("capturable-after-rewrite", [])
    assert outcome.rewritten and not outcome.model_only
