"""GFY302 fixed by the rewrite: a deterministic factory chained to its copy gets `device=` instead (the same
tensor, made on the device); other host tensors are built before the step (tests/test_host_draws.py)."""

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


def test_a_name_bound_to_a_host_factory_still_blocks(settings):
    line = "base = torch.zeros(4); extra = base.to(device)"  # the step binds `base` itself
    result = rewrite_source(TEMPLATE.format(line=line), "train.py", settings)
    assert "CapturedStep" not in result.code  # the whole step is not captured (the model alone is)
    assert "GFY302" in result.outcomes[0].reasons
