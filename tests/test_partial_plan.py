"""Partial capture (the model's forward and backward replayed from graphs, the rest of the step eager):
what the planner lets through. A replayed backward hands autograd the graph's own gradient buffers, so
the gradients must be set to None before every backward: accumulating into them would be overwritten."""

import pytest

from graphify.rewrite import rewrite_source

TEMPLATE = """import torch
import torch.nn as nn
device = "cuda"
model = nn.Linear(32, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=1000)
criterion = nn.CrossEntropyLoss()
for epoch in range(4):
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
{body}
"""

EVERY_STEP = """\
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()"""

ACCUMULATING = """\
        loss = criterion(model(x), y) / 4
        loss.backward()
        if (i + 1) % 4 == 0:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()"""

SKIPPING = """\
        loss = criterion(model(x), y)
        loss.backward()
        if i % 10 == 9:
            continue
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()"""


def test_gradients_reset_every_step_allow_partial_capture(settings):
    result = rewrite_source(TEMPLATE.format(body=EVERY_STEP), "train.py", settings)
    assert result.outcomes[0].verdict.value == "partially-capturable"
    assert "graphed_model(x)" in result.code


@pytest.mark.parametrize("body", [ACCUMULATING, SKIPPING], ids=["accumulation", "continue"])
def test_gradients_kept_across_steps_refuse_it(settings, body):
    result = rewrite_source(TEMPLATE.format(body=body), "train.py", settings)
    assert not result.changed
    assert result.outcomes[0].verdict.value == "not-capturable"
