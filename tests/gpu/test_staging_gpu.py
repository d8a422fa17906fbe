"""Staged batch copies on a GPU (`train_step.stage(x, device)`, graphify/runtime/staging.py): the tensor
`x.to(device)` returns, from pageable and pinned memory, contiguous or not; a buffer written again right
after its copy leaves the copy as it was; the CPU does not wait for the work queued before the copy;
a staged loop trains as the written one."""

from __future__ import annotations

import time

import pytest
import torch
from harness import assert_all_close, mse_step, no_fallback, small_model

from graphify.runtime import CapturedStep
from graphify.runtime.staging import staged_copy


@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_the_staged_tensor_is_the_one_to_returns(pinned, layout):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(64, 48, generator=g)
    base = base.pin_memory() if pinned else base
    x = {"contiguous": base, "transposed": base.t(), "sliced": base[::2, 3:]}[layout]
    expected = x.to("cuda")
    staged = staged_copy(x, "cuda")
    torch.cuda.synchronize()
    assert staged.device == expected.device and staged.dtype == expected.dtype
    assert staged.shape == expected.shape and staged.stride() == expected.stride()
    assert torch.equal(staged, expected)


@pytest.mark.parametrize("pinned", [False, True])
def test_a_buffer_refilled_after_its_copy_leaves_the_copy_as_it_was(pinned):
    buffer = torch.empty(1 << 20)
    buffer = buffer.pin_memory() if pinned else buffer
    copies = []
    torch.cuda._sleep(50_000_000)  # the current stream busy for a while: a copy ordered after it would read late
    for value in range(4):
        buffer.fill_(float(value))
        copies.append(staged_copy(buffer, "cuda"))
    torch.cuda.synchronize()
    assert [float(c[0]) for c in copies] == [0.0, 1.0, 2.0, 3.0]
    assert all(bool((c == c[0]).all()) for c in copies)


def test_the_cpu_does_not_wait_for_the_work_queued_before_the_copy():
    x = torch.randn(256, 256)
    torch.cuda.synchronize()
    started = time.perf_counter()
    torch.cuda._sleep(200_000_000)  # about 0.1 s or more of GPU time on the current stream
    staged = staged_copy(x, "cuda")
    staged_at = time.perf_counter() - started
    y = staged * 2  # the current stream waits for the copy: its values are there
    torch.cuda.synchronize()
    waited = time.perf_counter() - started
    assert staged_at < waited / 4, (staged_at, waited)
    assert torch.equal(y.cpu(), x * 2)
    blocking_started = time.perf_counter()
    torch.cuda._sleep(200_000_000)
    x.to("cuda")  # the written copy waits for the sleep
    assert time.perf_counter() - blocking_started > 4 * staged_at


def test_the_copy_is_ordered_for_the_current_stream_whichever_it_is():
    x = torch.randn(512, 512)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)
        y = staged_copy(x, "cuda") + 1  # queued on `stream`, after the copy
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), x + 1)


def test_a_staged_loop_trains_as_the_written_one(always_capture):
    def run(stage: bool):
        model = small_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        step = mse_step(model, optimizer)
        wrapped = CapturedStep(step) if stage else step
        g = torch.Generator().manual_seed(3)
        losses = []
        for _ in range(12):
            x, y = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
            x, y = (wrapped.stage(x, "cuda"), wrapped.stage(y, "cuda")) if stage else (x.to("cuda"), y.to("cuda"))
            losses.append(float(wrapped(x, y)))
        return losses, [p.detach().clone() for p in model.parameters()]

    with no_fallback():
        staged = run(stage=True)
    written = run(stage=False)
    assert_all_close(staged[0], written[0])
    assert_all_close(staged[1], written[1])
