"""GFY302 fixed by the rewrite: a deterministic factory chained to its copy gets `device=` instead (the same
tensor, made on the device); anything else stays a breaker that blocks the capture."""

import pytest

from graphify.rewrite import rewrite_source

TEMPLATE = """import torch
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
    ("line", "rewritten"),
    [
        ("extra = torch.zeros(4).to(device)", "extra = torch.zeros(4, device=device)"),
        ("extra = torch.ones(2, 4).cuda()", 'extra = torch.ones(2, 4, device="cuda")'),
        ("extra = torch.eye(4).to(device=device, non_blocking=True)", "extra = torch.eye(4, device=device)"),
        ("extra = torch.full((4,), 0.5).to(x.device)", "extra = torch.full((4,), 0.5, device=x.device)"),
    ],
)
def test_deterministic_factories_are_built_on_the_device(settings, line, rewritten):
    result = rewrite_source(TEMPLATE.format(line=line), "train.py", settings)
    assert result.outcomes[0].rewritten, result.outcomes[0].reasons
    assert rewritten in result.code and line not in result.code


@pytest.mark.parametrize(
    "line",
    [
        "extra = torch.randn(4).to(device)",  # another generator: different numbers
        "extra = torch.zeros(4).to(device, torch.float16)",  # a dtype too
        "extra = torch.arange(4.0).to(device)",  # float ranges may round differently on the device
        "base = torch.zeros(4); extra = base.to(device)",  # a name bound to the factory
        "extra = torch.zeros(4).cuda(1)",
    ],
)
def test_other_host_tensors_still_block(settings, line):
    result = rewrite_source(TEMPLATE.format(line=line), "train.py", settings)
    assert not result.outcomes[0].rewritten
    assert "GFY302" in result.outcomes[0].reasons
