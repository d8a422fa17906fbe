"""Host state the loop changes and a model's forward reads (a module-level array, dict, object or name,
or a closure's variable when the class is defined in the loop's function), or a module function the
step calls (a loss reading a module-level weight the module-level loop sets): a captured step would keep
the value read at capture, so neither the whole step nor the model alone is captured (GFY703). Each case
was rewritten whole, silently frozen, before the analysis matched a forward's free names to the loop's."""

import pytest

from graphify.rewrite import rewrite_source

MODULE_LEVEL = """import numpy as np
import torch
import torch.nn as nn
{prelude}
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)
    def forward(self, x):
        return self.fc(x) * {read}
model = Net().cuda()
optimizer = torch.optim.Adam(model.parameters(), capturable=True)
for i, (x, y) in enumerate(loader):
    {write}
    loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

CASES = {
    "numpy-item": ("A = np.ones(1)", "float(A[0])", "A[0] = 1.0 + i / 100"),
    "numpy-fill": ("A = np.ones(1)", "float(A[0])", "A.fill(1.0 + i / 100)"),
    "dict": ('CFG = {"scale": 1.0}', 'CFG["scale"]', 'CFG["scale"] = 1.0 + i / 100'),
    "object": ("import types\nSET = types.SimpleNamespace(scale=1.0)", "SET.scale", "SET.scale = 1.0 + i / 100"),
    "name": ("scale = 1.0", "scale", "scale = 1.0 + i / 100"),
    "list-append": ("HIST = [1.0]", "HIST[-1]", "HIST.append(1.0 + i / 100)"),
    "cpu-tensor-item": ("S = torch.ones(1)", "float(S[0])", "S[0] = 1.0 + i / 100"),
}

IN_A_FUNCTION = """import torch
import torch.nn as nn


def main(loader):
    scale = 1.0

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 1)

        def forward(self, x):
            return self.fc(x) * scale

    model = Net().cuda()
    optimizer = torch.optim.Adam(model.parameters(), capturable=True)
    for i, (x, y) in enumerate(loader):
        scale = 1.0 + i / 100
        loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


A_LOSS_FUNCTION = """import torch
import torch.nn as nn
import torch.nn.functional as F
WEIGHT = 1.0
def loss_fn(out, y):
    return F.mse_loss(out, y) * WEIGHT
model = nn.Linear(8, 1).cuda()
optimizer = torch.optim.Adam(model.parameters(), capturable=True)
for i, (x, y) in enumerate(loader):
    WEIGHT = 1.0 + i / 100
    loss = loss_fn(model(x.cuda()), y.cuda())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


A_GLOBAL_OF_MAIN = """import torch
import torch.nn as nn
WEIGHT = 1.0
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)
    def forward(self, x):
        return self.fc(x) * WEIGHT
def main(loader):
    global WEIGHT
    model = Net().cuda()
    optimizer = torch.optim.Adam(model.parameters(), capturable=True)
    for i, (x, y) in enumerate(loader):
        WEIGHT = 1.0 + i / 100
        loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

THE_EPOCH = """import torch
import torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)
    def forward(self, x):
        return self.fc(x) * (0.5 if epoch < 2 else 1.0)
model = Net().cuda()
optimizer = torch.optim.Adam(model.parameters(), capturable=True)
for epoch in range(4):
    for x, y in loader:
        loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


A_CONTAINER_OF_THE_MODEL = """import torch
import torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)
        self.seen = {made}
    def forward(self, x):
        return self.fc(x) * {read}
model = Net().cuda()
optimizer = torch.optim.Adam(model.parameters(), capturable=True)
for i, (x, y) in enumerate(loader):
    {write}
    loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


A_DICT_HANDED_TO_THE_MODEL = """import torch
import torch.nn as nn
class Head(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc = nn.Linear(8, 1)
        self.cfg = cfg
    def forward(self, x):
        return self.fc(x) * self.cfg["scale"]
cfg = {"scale": 1.0}
model = Head(cfg).cuda()
optimizer = torch.optim.Adam(model.parameters(), capturable=True)
for i, (x, y) in enumerate(loader):
    cfg["scale"] = 1.0 + i / 100
    loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


AN_INFERENCE_LOOP = """import torch
import torch.nn as nn
CFG = {"t": 1.0}
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
    def forward(self, x):
        return self.fc(x) / CFG["t"]
def evaluate(model, loader):
    outs = []
    with torch.no_grad():
        for i, x in enumerate(loader):
            CFG["t"] = 1.0 + i / 10
            outs.append(model(x.cuda()).softmax(-1))
    return outs
outs = evaluate(Net().cuda().eval(), loader)
"""


def sources():
    for name, (prelude, read, write) in CASES.items():
        yield pytest.param(MODULE_LEVEL.format(prelude=prelude, read=read, write=write), id=name)
    yield pytest.param(IN_A_FUNCTION, id="closure-of-a-local-class")
    yield pytest.param(A_LOSS_FUNCTION, id="module-function-at-module-level")
    yield pytest.param(A_GLOBAL_OF_MAIN, id="declared-global-in-the-loops-function")
    yield pytest.param(THE_EPOCH, id="rebound-by-the-enclosing-loop")
    yield pytest.param(A_DICT_HANDED_TO_THE_MODEL, id="a-dict-the-model-was-given")
    yield pytest.param(AN_INFERENCE_LOOP, id="an-inference-loop-of-a-model-made-with-eval")
    attribute_list = dict(made="[]", read="(1.0 + len(self.seen) / 100)", write="model.seen.append(i)")
    yield pytest.param(A_CONTAINER_OF_THE_MODEL.format(**attribute_list), id="a-list-attribute-appended")
    attribute_dict = dict(made='{"scale": 1.0}', read='self.seen["scale"]', write="model.seen.update(scale=1.0 + i / 100)")
    yield pytest.param(A_CONTAINER_OF_THE_MODEL.format(**attribute_dict), id="a-dict-attribute-updated")


@pytest.mark.parametrize("source", list(sources()))
def test_state_the_forward_reads_keeps_the_loop_eager(settings, source):
    result = rewrite_source(source, "train.py", settings)
    outcome = result.outcomes[0]
    assert not result.changed and "GFY703" in outcome.reasons, (outcome.verdict, outcome.reasons)


def test_the_same_loop_is_captured_when_the_forward_reads_nothing_the_loop_changes(settings):
    source = MODULE_LEVEL.format(prelude="A = np.ones(1)", read="2.0", write="A[0] = 1.0 + i / 100")
    assert "CapturedStep(train_step" in rewrite_source(source, "train.py", settings).code


def test_a_model_made_through_eval_is_followed(settings):
    """`Net().to(device).eval()` is a `Net` (nn.Module's to/cuda/eval/half... return the module): its
    forward is read, and a host read in it found."""
    source = MODULE_LEVEL.format(prelude="", read="2.0 + x.sum().item()", write="pass").replace(
        "Net().cuda()", "Net().cuda().eval().train()"
    )
    assert "GFY001" in rewrite_source(source, "train.py", settings).outcomes[0].reasons


def test_a_local_class_forward_is_read(settings):
    """A class defined in the loop's function is followed like a module's: a host read in its forward
    is found, not trusted."""
    source = IN_A_FUNCTION.replace("return self.fc(x) * scale", "return self.fc(x) * 2.0 + x.sum().item()").replace(
        "        scale = 1.0 + i / 100\n", ""
    )
    outcome = rewrite_source(source, "train.py", settings).outcomes[0]
    assert "GFY001" in outcome.reasons, outcome.reasons
