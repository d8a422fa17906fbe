"""Partial capture (the model's forward and backward replayed from graphs, the rest of the step eager):
what the planner lets through. A replayed backward hands autograd the graph's own gradient buffers; the
runtime copies gradients still present out of them before each replay, so accumulation is allowed
(tests/gpu/test_partial_capture_gpu.py proves it on a GPU). A call made while the last replay still waits for
its backward runs eagerly, so the model may also be called under a condition or twice in a step."""

import pytest

from graphify.rewrite import rewrite_source

TEMPLATE = """import torch
import torch.nn as nn
device = "cuda"
model = nn.Linear(32, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=1000)
target_model = nn.Linear(32, 4).to(device)
encoder = nn.Linear(32, 32).to(device)
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


KEYWORD_VALUE = """\
        optimizer.zero_grad()
        loss = criterion(model(x, scale=0.5), y)
        loss.backward()
        optimizer.step()
        scheduler.step()"""


TWICE_AND_TARGET = """\
        optimizer.zero_grad()
        with torch.no_grad():
            target = target_model(x).argmax(1)
        loss = criterion(model(x), y) + criterion(model(x.flip(0)), target)
        loss.backward()
        optimizer.step()
        scheduler.step()"""

TWO_MODELS = """\
        optimizer.zero_grad()
        loss = criterion(model(encoder(x)), y)
        loss.backward()
        optimizer.step()
        scheduler.step()"""


@pytest.mark.parametrize(
    "body",
    [EVERY_STEP, ACCUMULATING, KEYWORD_VALUE, SKIPPING, TWICE_AND_TARGET],
    ids=["every-step", "accumulation", "keyword", "continue", "twice"],
)
def test_partial_capture_allows(settings, body):
    result = rewrite_source(TEMPLATE.format(body=body), "train.py", settings)
    assert result.outcomes[0].verdict.value == "partially-capturable"
    assert "graphed_model(x" in result.code
    assert "target_model(x)" in result.code or "target_model" not in body  # under no_grad: stays eager


def test_two_trained_models_are_graphed_each(settings):
    result = rewrite_source(TEMPLATE.format(body=TWO_MODELS), "train.py", settings)
    assert result.outcomes[0].verdict.value == "partially-capturable"
    assert result.outcomes[0].step_name == "graphed_model, graphed_encoder"
    assert "graphed_model(graphed_encoder(x))" in result.code
    assert "graphed_encoder = GraphedModule(encoder)" in result.code and "graphed_model = GraphedModule(model)" in result.code


def test_a_ddp_model_is_not_graphed_alone(settings):
    source = TEMPLATE.format(body=EVERY_STEP).replace(
        "criterion = nn.CrossEntropyLoss()", "criterion = nn.CrossEntropyLoss()\nmodel = torch.nn.parallel.DistributedDataParallel(model)"
    )
    result = rewrite_source(source, "train.py", settings)
    assert not result.changed and result.outcomes[0].verdict.value == "not-capturable"


TRAINER = """import math
import random
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
{forward}


class Trainer:
    def __init__(self, loader, device{injected}):
        self.model = {model}
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.loader = loader
        self.device = device

    def fit(self, epochs):
        for epoch in range(epochs):
            for x, y in self.loader:
                x, y = x.to(self.device), y.to(self.device)
                loss = nn.functional.cross_entropy(self.model(x), y)
                if not math.isfinite(loss.item()):
                    raise RuntimeError("loss diverged")
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
{rebind}"""
CLEAN_FORWARD = "        return self.body(x)"


def _trainer(forward=CLEAN_FORWARD, injected="", model="Net().to(device)", rebind=""):
    return TRAINER.format(forward=forward, injected=injected, model=model, rebind=rebind)


def test_a_model_held_in_an_attribute_is_graphed_when_its_class_is_known(settings):
    result = rewrite_source(_trainer(), "train.py", settings)
    assert result.outcomes[0].verdict.value == "partially-capturable"
    assert "        graphed_model = GraphedModule(self.model)\n        for epoch in range(epochs):" in result.code
    assert "nn.functional.cross_entropy(graphed_model(x), y)" in result.code


@pytest.mark.parametrize(
    "source",
    [
        _trainer(forward="        if random.random() < 0.5:\n            x = x.flip(0)\n        return self.body(x)"),
        _trainer(injected=", model", model="model.to(device)"),
        _trainer(rebind="                self.model = Net().to(self.device)\n"),
    ],
    ids=["host-draw-in-forward", "class-unknown", "rebound-in-loop"],
)
def test_a_model_held_in_an_attribute_is_left_eager_when_it_cannot_be_checked(settings, source):
    result = rewrite_source(source, "train.py", settings)
    assert not result.changed and result.outcomes[0].verdict.value == "not-capturable"


def test_a_model_called_through_a_method_is_not_graphed_alone(settings):
    """`model.forward(x)`: GraphedModule graphs a module's call, not one of its methods."""
    source = _trainer().replace("self.model(x)", "self.model.forward(x)")
    assert "self.model.forward(x)" in source
    result = rewrite_source(source, "train.py", settings)
    assert not result.changed and result.outcomes[0].verdict.value == "not-capturable"


ACTION_PICKED_WITH_GRAD = """\
        scores = model(x[:1])
        pick = torch.argmax(scores, dim=1).item()
        codes = encoder(x).detach()
        optimizer.zero_grad()
        loss = criterion(model(encoder(x)), y)
        loss.backward()
        optimizer.step()
        scheduler.step()"""


def test_calls_no_backward_reaches_stay_on_the_module(settings):
    """An action picked with gradients on (`argmax(model(obs))`) and a detached output never see a
    backward: graphed, the first would leave the graph waiting for one and the model eager for good."""
    result = rewrite_source(TEMPLATE.format(body=ACTION_PICKED_WITH_GRAD), "train.py", settings)
    assert result.outcomes[0].verdict.value == "partially-capturable"
    assert "scores = model(x[:1])" in result.code and "codes = encoder(x).detach()" in result.code
    assert "graphed_model(graphed_encoder(x))" in result.code


def test_a_name_read_elsewhere_keeps_its_call_graphed(settings):
    body = ACTION_PICKED_WITH_GRAD.replace("scheduler.step()", "scheduler.step()\n        print(scores.sum())")
    result = rewrite_source(TEMPLATE.format(body=body), "train.py", settings)
    assert "scores = graphed_model(x[:1])" in result.code


def test_items_written_into_an_array_the_loop_made_leave_the_model_graphed(settings):
    """fixtures/check/dqn_action_with_grad.py fills numpy replay buffers in the loop (GFY703 for the whole
    step): only the eager code around the model reads them, so the model is graphed. Buffers that came
    from elsewhere may be state the forward reads: refused as before."""
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / "fixtures/check/dqn_action_with_grad.py").read_text()
    made_here = rewrite_source(source, "dqn.py", settings)
    assert "graphed_q_network = GraphedModule(q_network)" in made_here.code
    handed_in = source.replace("np.zeros((capacity, 4), dtype=np.float32)", "env.buffer()")
    refused = rewrite_source(handed_in, "dqn.py", settings).outcomes[0]
    assert not refused.rewritten and "GFY703" in refused.partial_refusal


def test_an_array_the_forward_reads_keeps_the_loop_refused(settings):
    source = """import numpy as np
import torch
import torch.nn as nn
gains = np.ones(4, dtype=np.float32)
class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 4)
    def forward(self, x):
        return self.fc(x) * float(gains[0])
model = Scaled().cuda()
optimizer = torch.optim.Adam(model.parameters(), capturable=True)
for i, (x, y) in enumerate(loader):
    gains[0] = 1.0 + i / 100
    loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
    result = rewrite_source(source, "train.py", settings)
    assert "GFY703" in result.outcomes[0].reasons and "GraphedModule" not in result.code, [o.reasons for o in result.outcomes]
