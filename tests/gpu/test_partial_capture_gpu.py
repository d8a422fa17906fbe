"""Partial capture on a GPU: a loop whose optimizer side cannot be captured (SGD under OneCycleLR)
replays only the model's forward and backward, and trains like the original.

The script has what makes partial capture hard: batch norm (its running statistics must not see
make_graphed_callables' warmup passes), dropout (the CUDA RNG must be where eager would leave it)
and a last partial batch of each epoch (it must run eagerly, not crash a replay). Its variants keep
gradients across replays (accumulation over micro-batches, zeroing in place), pass the model a
keyword value, and call the model again before the last call's backward (twice in a step, or a loss
kept for the next iteration). These tests check what replays do, so they keep the graphs whatever
their timing says (GRAPHIFY_CAPTURE=always); a model whose graphs would gain nothing stays eager.
"""

from __future__ import annotations

import textwrap

import pytest

from graphify.rewrite import rewrite_source
from graphify.verify import verify_file


SCRIPT = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    device = "cuda"
    model = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(TensorDataset(torch.randn(100, 32), torch.randint(0, 4, (100,))), batch_size=16, shuffle=True)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, epochs=4, steps_per_epoch=len(loader))
    criterion = nn.CrossEntropyLoss()

    for epoch in range(4):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
""")


@pytest.mark.usefixtures("always_capture")
def test_partial_capture_trains_like_the_original(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    result = rewrite_source(SCRIPT, str(path))
    assert [o.verdict.value for o in result.outcomes] == ["partially-capturable"]
    assert "GraphedModule(model)" in result.code
    report = verify_file(str(path), steps=20)  # 7 batches an epoch, the 7th of 4 samples
    assert report.passed, (report.message, report.detail, report.to_dict())
    rewrite = report.rewrite.data
    assert rewrite["graphs"] == 2  # one forward and one backward graph, captured once
    assert report.original.data["graphs"] == 0


ACCUMULATING = SCRIPT.replace(
    """    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()""",
    """    for i, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        loss = criterion(model(x), y) / 2
        loss.backward()
        if i % 2 == 1:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()""",
)
ZEROED_IN_PLACE = SCRIPT.replace("optimizer.zero_grad()", "optimizer.zero_grad(set_to_none=False)")
KEYWORD = SCRIPT.replace(
    "nn.Linear(64, 4)).to(device)",
    "nn.Linear(64, 4)).to(device)\nmodel.forward = lambda x, temperature=1.0, f=model.forward: f(x) / temperature",
).replace("model(x), y)", "model(x, temperature=2.0), y)")

# a replay whose backward is still to come when the model is called again: the later call must run
# eagerly, or its replay would overwrite the activations the first one's backward reads
CALLED_TWICE = SCRIPT.replace(
    "loss = criterion(model(x), y)", "loss = criterion(model(x), y) + 0.5 * criterion(model(x.flip(0)), y.flip(0))"
)
LOSSES_SUMMED = SCRIPT.replace(
    """    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()""",
    """    for i, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        loss = criterion(model(x), y)
        if i % 2 == 0:
            first = loss
            continue
        optimizer.zero_grad()
        (first + loss).backward()
        optimizer.step()
        scheduler.step()""",
)


@pytest.mark.parametrize(
    "script",
    [ACCUMULATING, ZEROED_IN_PLACE, KEYWORD, CALLED_TWICE, LOSSES_SUMMED],
    ids=["accumulation", "zeroed-in-place", "keyword", "called-twice", "losses-summed"],
)
@pytest.mark.usefixtures("always_capture")
def test_gradients_kept_across_replays_train_like_the_original(tmp_path, script):
    assert script != SCRIPT
    path = tmp_path / "train.py"
    path.write_text(script)
    result = rewrite_source(script, str(path))
    assert [o.verdict.value for o in result.outcomes] == ["partially-capturable"]
    report = verify_file(str(path), steps=20)
    assert report.passed, (report.message, report.detail, report.to_dict())
    assert report.rewrite.data["graphs"] == 2


def test_a_model_left_eager_is_named_with_the_reason_in_verify(tmp_path):
    """A GPU-bound model (big matmuls keep the GPU busy far longer than their launch): the runtime leaves
    it eager, and verify's verdict gives the runtime's reason."""
    script = (
        SCRIPT.replace(
            "nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))",
            "nn.Sequential(nn.Linear(32, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4))",
        )
        .replace("torch.randn(100, 32), torch.randint(0, 4, (100,))", "torch.randn(8192, 32), torch.randint(0, 4, (8192,))")
        .replace("batch_size=16", "batch_size=4096")
    )
    assert script != SCRIPT
    path = tmp_path / "train.py"
    path.write_text(script)
    assert "GraphedModule(model)" in rewrite_source(script, str(path)).code
    report = verify_file(str(path), steps=12)
    assert report.passed, (report.message, report.detail, report.to_dict())
    assert report.verdict.startswith("the runtime ran the model eagerly (no gain expected: GPU-bound"), report.verdict
