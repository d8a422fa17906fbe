"""Staged batch copies: which device copies `graphify rewrite` writes as `step.stage(x, device)`
(graphify/rewrite/staging.py), and what `stage` does where it does not copy on a copy stream
(graphify/runtime/staging.py): exactly what the written `.to` or `.cuda()` does. The copy stream itself
is tested on the GPU (tests/gpu/test_staging_gpu.py)."""

import textwrap

import pytest
import torch

from graphify.rewrite.api import rewrite_source
from graphify.runtime import CapturedStep
from graphify.runtime.staging import staged_copy

LOOP = """
import torch
from torch import nn

device = torch.device("cuda")
model = nn.Linear(4, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(4)]
for x, y in loader:
    {copy}
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
"""


def rewritten_copy_line(copy: str) -> str:
    result = rewrite_source(textwrap.dedent(LOOP.format(copy=copy)), "train.py")
    assert result.changed
    return next(line.strip() for line in result.code.splitlines() if line.strip().startswith("x, y =") or line.strip().startswith("x ="))


@pytest.mark.parametrize(
    ("copy", "staged"),
    [
        ("x, y = x.to(device), y.to(device)", "x, y = train_step.stage(x, device), train_step.stage(y, device)"),
        ("x, y = x.cuda(), y.cuda()", "x, y = train_step.stage(x), train_step.stage(y)"),
        ("x, y = x.to(device, non_blocking=True), y.to(device=device)", "x, y = train_step.stage(x, device), train_step.stage(y, device)"),
        ('x, y = x.to("cuda:0"), y.cuda(0)', 'x, y = train_step.stage(x, "cuda:0"), train_step.stage(y, 0)'),
    ],
)
def test_a_batchs_copy_outside_the_step_is_staged(copy, staged):
    assert rewritten_copy_line(copy) == staged


@pytest.mark.parametrize(
    "copy",
    [
        "x, y = x.to(device, torch.float32), y.to(device)",  # a dtype too: `.to` may return another tensor
        "x, y = x.to(device, dtype=torch.float32), y.to(device, copy=True)",
        "x, y = x.to(*[device]), y.to(**{'device': device})",
    ],
)
def test_copies_that_do_more_than_move_stay_as_written(copy):
    line = rewritten_copy_line(copy)
    assert line == copy or ".stage(x" not in line


def test_a_copy_inside_a_helper_stays_as_written():
    source = LOOP.replace("for x, y in loader:", "def to_device(t):\n    return t.to(device)\n\nfor x, y in loader:")
    result = rewrite_source(textwrap.dedent(source.format(copy="x, y = to_device(x), to_device(y)")), "train.py")
    assert result.changed and "return t.to(device)" in result.code and ".stage(" not in result.code


class Batch:
    """A batch object with its own `.to` (a tokenizer's BatchEncoding, a graph's Data)."""

    def __init__(self):
        self.moved_to = None

    def to(self, device):
        self.moved_to = device
        return self

    def cuda(self):
        self.moved_to = "cuda()"
        return self


def test_stage_is_the_written_call_where_it_does_not_stage():
    x = torch.arange(6.0).reshape(2, 3).t()  # not contiguous: `.to` keeps its strides
    moved = staged_copy(x, "cpu")
    assert moved is x.to("cpu") is x  # no copy at all, as `.to` makes none
    half = staged_copy(x, torch.float16)  # a dtype handed where a device goes: `.to(dtype)`
    assert half.dtype == torch.float16 and torch.equal(half, x.to(torch.float16)) and half.stride() == x.to(torch.float16).stride()
    batch = Batch()
    assert staged_copy(batch, "cuda:0") is batch and batch.moved_to == "cuda:0"
    assert staged_copy(batch) is batch and batch.moved_to == "cuda()"
    module = torch.nn.Linear(2, 2)
    assert staged_copy(module, "cpu") is module
    leaf = torch.ones(2, requires_grad=True)
    assert staged_copy(leaf, "cpu") is leaf


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without CUDA does")
def test_without_cuda_a_copy_to_cuda_fails_as_the_written_one_does():
    x = torch.ones(2)
    with pytest.raises((RuntimeError, AssertionError)) as written:
        x.to("cuda")
    with pytest.raises(type(written.value)):
        staged_copy(x, "cuda")


def test_the_step_wrapper_offers_stage():
    step = CapturedStep(lambda x: x + 1)
    x = torch.ones(3)
    assert step.stage(x, "cpu") is x and step.stage is staged_copy
