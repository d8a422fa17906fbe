"""Scripts that capture CUDA graphs themselves: their warmup and replay loops are `already-captured`
(reported, never flagged or rewritten), the other loops beside them are analysed as usual."""

from graphify.config import Settings
from graphify.engine import analyze_source
from graphify.rewrite import rewrite_source

GRAPHED_CALLABLE = """import torch
import torch.nn as nn
model = nn.Linear(8, 2).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()

def train(loader):
    graphed = torch.cuda.make_graphed_callables(model, (torch.randn(4, 8, device="cuda"),))
    for x, y in loader:
        loss = criterion(graphed(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        for x, y in loader:
            preds = model(x.cuda()).argmax(1)
            print(preds.sum().item())
"""

SIDE_STREAM_PREFETCH = """import torch
import torch.nn as nn
model = nn.Linear(8, 2).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def train(loader):
    copier = torch.cuda.Stream()
    with torch.cuda.stream(copier):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            opt.step()
"""


def _loops(source):
    return [(lp.line, lp.kind, lp.verdict.value) for lp in analyze_source(source, "t.py", Settings()).loops]


def test_a_loop_calling_a_graphed_callable_is_already_captured_and_the_next_loop_is_analysed():
    assert _loops(GRAPHED_CALLABLE) == [(9, "train", "already-captured"), (15, "inference", "capturable-after-rewrite")]
    result = rewrite_source(GRAPHED_CALLABLE, "t.py", Settings())
    assert "graphed(x)" in result.code and "inference_step" in result.code and "train_step" not in result.code


def test_side_stream_work_of_a_function_that_captures_nothing_is_left_alone():
    assert _loops(SIDE_STREAM_PREFETCH) == []
