"""graphify.runtime on a GPU: a failed capture falls back with state intact, re-entered loops reuse their
graphs, nested outputs replay, a DDP model built outside the capture stream runs eagerly with one warning,
a one-GPU DataParallel model is captured, and a GPU-bound step stays eager."""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
from harness import Schedule, assert_all_close, batches, eager, fallbacks, mse_step, no_fallback, snapshot

from graphify.runtime import CapturedStep, GraphedModule, GraphifyFallbackWarning

Batch = collections.namedtuple("Batch", "x y")


def _setup():
    """A seeded MLP with dropout (its draws are part of what must match), SGD with momentum, 12 batches."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(32, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt, list(batches(12, size=16, width=8))


def _state(model, opt):
    """(parameters, momenta, CUDA and CPU generator states)."""
    params = snapshot(model.parameters())
    momenta = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    return params, momenta, torch.cuda.get_rng_state(), torch.get_rng_state()


def _run(make_step, steps=12):
    model, opt, batches = _setup()
    step = make_step(model, opt)
    for x, y in batches[:steps]:
        step(x, y)
    return _state(model, opt)


def _failing_step(model, opt):
    def train_step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if loss.item() > 1e9:  # a host sync: capture fails here
            return loss
        opt.step()
        return loss

    return CapturedStep(train_step)


def test_a_failed_capture_falls_back_with_state_intact():
    expected = _run(mse_step)
    with fallbacks() as messages:
        got = _run(_failing_step)
    assert len(messages) == 1 and "capture failed" in messages[0], messages
    for a, b in zip(expected[0] + expected[1], got[0] + got[1]):
        assert torch.equal(a, b)  # the same kernels in the same order: bit for bit
    assert torch.equal(expected[2], got[2]) and torch.equal(expected[3], got[3])  # RNG states


def _epoch(model, opt, batches):
    def train_step(batch):
        opt.zero_grad()
        out = model(batch.x)
        loss = torch.nn.functional.mse_loss(out, batch.y)
        loss.backward()
        opt.step()
        return {"loss": loss, "parts": (out, loss.detach())}

    train_step = CapturedStep(train_step)
    for x, y in batches:
        out = train_step(Batch(x, y))
        out = train_step.copy(out)
    return train_step, out


def test_a_reentered_loop_reuses_its_graph_and_outputs_keep_their_structure(captures):
    model, opt, batches = _setup()
    with no_fallback():
        for _ in range(3):
            step, out = _epoch(model, opt, batches[:6])
    assert captures == [1]  # epochs 2 and 3 replay epoch 1's graph, without warmup
    assert sum(entry.eager_runs for entry in step.state.keys.values()) == 3 + 1  # warmup, and one call more to record host values
    assert set(out) == {"loss", "parts"} and isinstance(out["parts"], tuple)
    reference, ref_opt, _ = _setup()
    for _ in range(3):
        for x, y in batches[:6]:
            ref_opt.zero_grad()
            torch.nn.functional.mse_loss(reference(x), y).backward()
            ref_opt.step()
    assert_all_close(model.parameters(), reference.parameters())


def test_a_ddp_model_built_outside_the_capture_stream_runs_eagerly_with_one_warning(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        expected = _run(mse_step)
        model, opt, batches = _setup()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        with fallbacks() as messages:
            step = CapturedStep(mse_step(ddp, opt))
            for x, y in batches:
                step(x, y)
        assert messages == [
            "graphify: `mse_step.<locals>.train_step` runs eagerly: the step runs a DistributedDataParallel model built "
            "outside graphify's capture stream (rewrite the file that builds it)"
        ]
        got = _state(model, opt)
        assert_all_close(got[0], expected[0], rtol=1e-6, atol=1e-7)
    finally:
        dist.destroy_process_group()


def _matmul_step(size):
    weight = torch.randn(size, size, device="cuda", requires_grad=True)
    opt = torch.optim.SGD([weight], lr=1e-6)

    def train_step(x):
        loss = (x @ weight @ weight).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss

    return CapturedStep(train_step)


@pytest.mark.parametrize(("size", "always", "captured"), [(4096, False, False), (4096, True, True), (64, False, True)])
def test_a_gpu_bound_step_stays_eager_unless_asked(request, size, always, captured):
    """Big matmuls keep the GPU busy far longer than their launch: a replay would gain nothing."""
    if always:
        request.getfixturevalue("always_capture")
    step = _matmul_step(size)
    x = torch.randn(size, size, device="cuda")
    with fallbacks() as messages:
        for _ in range(6):
            step(x)
    assert bool(step.state.graphs) == captured
    assert (messages != []) == (not captured), messages
    assert all("no gain expected: GPU-bound" in m for m in messages)


def test_a_one_gpu_dataparallel_model_is_captured_and_trains_the_same():
    """`nn.DataParallel` on one GPU (common in single-GPU scripts) calls its module directly: it captures."""
    expected = _run(mse_step)
    model, opt, batches = _setup()
    wrapped = torch.nn.DataParallel(model, device_ids=[torch.cuda.current_device()])
    with no_fallback():
        step = CapturedStep(mse_step(wrapped, opt))
        for x, y in batches:
            step(x, y)
    assert step.state.graphs
    assert_all_close(_state(model, opt)[0], expected[0])


def _unfreezing(wrap_step, wrap_model, steps=16, unfreeze_at=6):
    """The first layer frozen for a few steps, then unfrozen between steps, outside the step (a
    fine-tuning schedule): the parameters after training, and the step or graphed module used."""
    model, opt, batches = _setup()
    model[0].requires_grad_(False)
    called = wrap_model(model)
    step = wrap_step(mse_step(called, opt))
    for i in range(steps):
        if i == unfreeze_at:
            model[0].requires_grad_(True)
        x, y = batches[i % len(batches)]
        step(x, y)
    return snapshot(model.parameters()), step, called


@pytest.mark.parametrize("graphed", ["step", "module"])
def test_graphs_follow_parameters_frozen_or_unfrozen_between_steps(always_capture, graphed):
    """Which parameters require grad is part of a graph's key: the graph captured while the first layer was
    frozen would leave it untrained after it is unfrozen."""
    expected, _, _ = _unfreezing(eager, eager)
    as_step, as_module = (CapturedStep, eager) if graphed == "step" else (eager, GraphedModule)
    with no_fallback():
        got, step, called = _unfreezing(as_step, as_module)
    if graphed == "step":
        assert len(step.state.graphs) == 2  # one graph per set of trained parameters
    else:
        assert called.state["graphed"] is not None
    assert not torch.equal(got[0], _setup()[0][0].weight.detach())  # the unfrozen layer trained
    assert_all_close(got, expected)


def _adding_a_param_group(wrap_step, steps=20, added_at=8):
    """Progressive unfreezing through the optimizer: the first layer takes part in every forward and
    backward, but the optimizer only steps it once its param group is added, between steps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).cuda()
    opt = torch.optim.Adam(model[2].parameters(), lr=1e-2)
    batches = [(torch.randn(8, 16, device="cuda"), torch.randn(8, 4, device="cuda")) for _ in range(4)]
    step = wrap_step(mse_step(model, opt))
    for i in range(steps):
        if i == added_at:
            opt.add_param_group({"params": model[0].parameters(), "lr": 1e-3})
        step(*batches[i % len(batches)])
    return snapshot(model.parameters()), step


def test_a_param_group_added_between_steps_is_stepped_by_the_next_graph(always_capture):
    """The graph captured before the group was added steps only the groups it saw: the runtime captures
    again, with the new group made capturable."""
    expected, _ = _adding_a_param_group(eager)
    with no_fallback():
        got, step = _adding_a_param_group(CapturedStep)
    assert step.state.graphs and step.state.recaptures == 1
    # eager Adam's bias correction runs on the host in double, the captured one on the device: rounding
    # apart; a graph that never steps the new group leaves the first layer about 1e-2 off
    assert_all_close(got, expected, rtol=1e-4, atol=1e-5)


def test_a_graph_kept_alive_outside_the_step_trains_as_eager_and_a_failed_capture_says_why():
    """An output of the model computed with grad on the default stream and kept (an action picked before
    the step) holds the parameters' gradient accumulators there, and the captured backward may have to
    wait on that stream. Whether the capture fails depends on what the process captured before (the
    first capture in a fresh process fails; after other captures it was seen to succeed). Either way the
    step trains as eager, and a failed capture's warning says what broke and what to do."""

    def run(make_step):
        model, opt, batches = _setup()
        step = make_step(mse_step(model, opt))
        for x, y in batches:
            kept = model(x[:1])  # noqa: F841 - alive through the step, as `q_values` in an agent's loop
            step(x, y)
        return _state(model, opt)

    expected = run(eager)
    with fallbacks() as messages:
        got = run(CapturedStep)
    assert len(messages) <= 1, messages
    if messages:
        assert "legacy stream depend on a capturing" in messages[0] and "torch.no_grad()" in messages[0], messages
    assert_all_close(got[0] + got[1], expected[0] + expected[1], rtol=1e-6, atol=1e-7)


def test_eager_code_after_the_replay_reads_the_graphs_gradients():
    """The optimizer steps after the replay, and `zero_grad()` unsets the gradients at the end of each
    iteration (the usual AMP order: `scaler.step`, `update`, `zero_grad`); a short batch runs eagerly in
    between. Each replay points `.grad` back at the buffers the graph writes, so the eager step trains
    on this batch's gradients, as eager does."""

    def run(wrap):
        model, opt, batches = _setup()
        batches = batches[:5] + [(batches[5][0][:7], batches[5][1][:7])] + batches[6:]  # a short batch: eager

        def train_step(x, y):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        step = wrap(train_step)
        for x, y in batches:
            step(x, y)
            opt.step()
            opt.zero_grad()
        return _state(model, opt), step

    expected = run(eager)[0]
    with no_fallback():
        got, step = run(CapturedStep)
    assert step.state.graphs
    assert_all_close(got[0] + got[1], expected[0] + expected[1], rtol=1e-6, atol=1e-7)


def test_a_submodule_switched_to_eval_gets_a_graph_of_its_own():
    """`model[1].eval()` (frozen batch norm) between steps: the modes of every submodule are in the key."""

    def run(wrap):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        def train_step(x, y):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()

        step = wrap(train_step)
        for i, (x, y) in enumerate(batches(16, size=16, width=8)):
            if i == 8:
                model[1].eval()
            step(x, y)
        return snapshot([*model.parameters(), *model.buffers()]), step

    expected = run(eager)[0]
    got, step = run(CapturedStep)
    assert len(step.state.graphs) == 2
    assert_all_close(got, expected, rtol=1e-6, atol=1e-7)


def test_an_optimizer_handed_in_as_an_argument_is_followed_and_a_new_one_is_not_trusted():
    """`train_step(model, opt, x, y)` per fold: the first fold's optimizer is found among the arguments
    (its scheduled learning rate is followed); a later fold's new optimizer leaves the step eager. (A new
    model alone would be a new key, with its modes in it.)"""

    def train_step(model, opt, x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    def run(step):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        states = []
        for _ in range(2):
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
            for _ in range(12):
                step(model, opt, torch.randn(16, 8, generator=g).cuda(), torch.randn(16, 1, generator=g).cuda())
                scheduler.step()
            states += [p.detach().clone() for p in model.parameters()]
        torch.cuda.synchronize()
        return states

    expected = run(train_step)
    captured = CapturedStep(train_step)
    with fallbacks() as messages:
        got = run(captured)
    assert len(messages) == 1 and "handed an optimizer other than" in messages[0], messages
    assert_all_close(got, expected, rtol=1e-6, atol=1e-7)


def test_a_step_left_eager_gives_the_optimizer_back_as_built():
    """A host value moving every step leaves the step eager at warmup: the AdamW made capturable for the
    capture runs as it was built again (host step counts, host arithmetic: fewer kernels), trains as eager,
    and the one warning points at the loop's line."""

    def run(wrap):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        moving = Schedule()  # a loss weight read through a property, moved every step below

        def train_step(x, y):
            loss = torch.nn.functional.mse_loss(model(x), y) * moving.weight
            opt.zero_grad()
            loss.backward()
            opt.step()

        step = wrap(train_step)
        g = torch.Generator().manual_seed(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(12):
                moving.t += 1
                step(torch.randn(16, 8, generator=g).cuda(), torch.randn(16, 1, generator=g).cuda())  # the warning's line
        return snapshot(model.parameters()), opt, [w for w in caught if issubclass(w.category, GraphifyFallbackWarning)]

    expected, _, _ = run(eager)
    got, opt, caught = run(CapturedStep)
    assert len(caught) == 1 and "changed between steps" in str(caught[0].message)
    assert caught[0].filename == __file__ and "the warning's line" in open(__file__).read().splitlines()[caught[0].lineno - 1]
    assert all(g["capturable"] is False for g in opt.param_groups)
    assert all(s["step"].device.type == "cpu" for s in opt.state.values())
    assert_all_close(got, expected)  # warmup ran the capturable arithmetic: rounding apart
