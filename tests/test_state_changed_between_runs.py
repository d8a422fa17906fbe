"""State the loop's enclosing loop changes between its runs through code of the file it calls (a helper
setting a config attribute or a module's dropout, a scheduler-like object's method, a loss module's
setter) or through a loop over `model.modules()`, read by the captured step: each was rewritten whole
and frozen at its first epoch's value. An optimizer's settings changed by a helper stay the runtime's
to follow, and that loop is still rewritten."""

import pytest

from graphify.rewrite import rewrite_source

TEMPLATE = """import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)
        self.drop = nn.Dropout(0.5)
    def forward(self, x):
        return self.fc(self.drop(x))

class Weight:
    def __init__(self):
        self.value = 1.0
    def step(self):
        self.value *= 0.9

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 1.0
    def set_scale(self, scale):
        self.scale = scale
    def forward(self, out, y):
        return self.scale * (out - y).pow(2).mean()

def set_aux(cfg, epoch):
    cfg.aux = 0.1 * epoch

def set_dropout(model, p):
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = p

def update_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr

def main(loader, cfg):
    model = Net().cuda()
    optimizer = torch.optim.Adam(model.parameters(), capturable=True)
    weight, criterion = Weight(), Scaled()
    for epoch in range(4):
        {between}
        for x, y in loader:
            out = model(x.cuda())
            loss = criterion(out, y.cuda()) * {read}
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""

CASES = {
    "helper-sets-config": ("set_aux(cfg, epoch)", "(1 + cfg.aux)"),
    "helper-sets-dropout": ("set_dropout(model, 0.5 / (1 + epoch))", "1.0"),
    "method-of-a-local-class": ("weight.step()", "weight.value"),
    "loss-module-setter": ("criterion.set_scale(1.0 + epoch)", "1.0"),
    "loop-over-modules": ("for m in model.modules():\n            if isinstance(m, nn.Dropout):\n                m.p = 0.1 * epoch", "1.0"),
}


@pytest.mark.parametrize("name", CASES)
def test_state_changed_between_runs_by_the_files_code_keeps_the_loop_eager(name):
    between, read = CASES[name]
    result = rewrite_source(TEMPLATE.format(between=between, read=read), "train.py")
    outcome = next(o for o in result.outcomes if o.kind == "train")
    assert not outcome.rewritten and "GFY703" in outcome.reasons, (name, outcome)


def test_an_optimizer_setting_changed_by_a_helper_is_left_to_the_runtime():
    result = rewrite_source(TEMPLATE.format(between="update_lr(optimizer, 1e-3 / (1 + epoch))", read="1.0"), "train.py")
    outcome = next(o for o in result.outcomes if o.kind == "train")
    assert outcome.rewritten, outcome


CALLER = """import types
import torch
import torch.nn as nn

def train_one_epoch(model, loader, optimizer, cfg):
    for x, y in loader:
        out = model(x.cuda())
        loss = (out - y.cuda()).pow(2).mean() + cfg.l1 * out.abs().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

model = nn.Linear(8, 1).cuda()
optimizer = torch.optim.Adam(model.parameters(), capturable=True)
settings = types.SimpleNamespace(l1=0.0)
for epoch in range(4):
    {between}
    train_one_epoch(model, loader, optimizer, settings)
"""


def test_state_a_caller_changes_between_calls_of_the_loops_function_keeps_it_eager():
    """`train_one_epoch(..., settings)` called each epoch after `settings.l1 = ...`: the graphs found again
    on each call would keep the first epoch's weight."""
    result = rewrite_source(CALLER.format(between="settings.l1 = 0.1 * epoch"), "train.py")
    outcome = next(o for o in result.outcomes if o.kind == "train")
    assert not outcome.rewritten and "GFY703" in outcome.reasons, outcome
    unchanged = rewrite_source(CALLER.format(between="print(epoch)"), "train.py")
    assert next(o for o in unchanged.outcomes if o.kind == "train").rewritten


def test_a_function_defined_beside_the_loop_reading_what_an_enclosing_loop_rebinds_keeps_it_eager():
    """`def criterion(out, y)` in `main`, reading `l2`, which the epoch loop rebinds: called by the step,
    it would read the first epoch's `l2` in every replay."""
    source = """import torch
import torch.nn as nn

def main(loader):
    model = nn.Linear(8, 1).cuda()
    optimizer = torch.optim.Adam(model.parameters(), capturable=True)
    l2 = 0.0

    def criterion(out, y):
        return (out - y).pow(2).mean() + l2 * sum(p.pow(2).sum() for p in model.parameters())

    for epoch in range(4):
        l2 = 0.01 * epoch
        for x, y in loader:
            loss = criterion(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""
    outcome = next(o for o in rewrite_source(source, "train.py").outcomes if o.kind == "train")
    assert not outcome.rewritten and "GFY703" in outcome.reasons, outcome
