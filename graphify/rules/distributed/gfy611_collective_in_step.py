"""GFY611 collective-in-step."""

from graphify.analysis.checker import code_of
from graphify.rules.distributed.shared import followed_calls, runs_collective
from graphify.rules.registry import rule

RULE = rule(
    "GFY611", "collective-in-step", "distributed", "error", "`torch.distributed` collectives and barriers need NCCL capture setup", False
)


def detect(ck):
    followed = followed_calls(ck)
    for node, site in ck.nodes():
        if runs_collective(node, site.env, followed):
            yield ck.finding(
                RULE,
                node,
                site,
                f"`{code_of(node)}` in the step",
                "capture needs NCCL >= 2.9.6 with async error handling off; or reduce outside the step",
            )


CASES = {
    "loss-module-handed-to-the-loop": (
        """
        import torch.distributed as dist
        class CenteredLoss(nn.Module):
            def forward(self, out):
                center = out.mean(0)
                dist.all_reduce(center)  # here
                return (out - center).pow(2).mean()
        def train(loss_fn, loader):
            for x, y in loader:
                loss = loss_fn(model(x))
                loss.backward(); opt.step(); opt.zero_grad()
        train(CenteredLoss(), None)
        """,
        """
        import torch.distributed as dist
        class CenteredLoss(nn.Module):
            def forward(self, out):
                return (out - out.mean(0)).pow(2).mean()
        def train(loss_fn, loader):
            for x, y in loader:
                loss = loss_fn(model(x))
                loss.backward(); opt.step(); opt.zero_grad()
        train(CenteredLoss(), None)
        """,
        False,
    ),
    "collective-helper-of-another-file": (
        """
        import util.misc as utils
        from dist_utils import reduce_tensor
        for x, y in loader:
            loss_dict = {"ce": criterion(model(x), y)}
            reduced = utils.reduce_dict(loss_dict)  # here
            loss = sum(loss_dict.values())
            mean_loss = reduce_tensor(loss.detach(), 2)  # here
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        import util.misc as utils
        from einops import reduce
        def reduce_dict(d):
            return {k: v.detach() for k, v in d.items()}
        for x, y in loader:
            loss_dict = {"ce": criterion(model(x), y)}
            reduced = reduce_dict(loss_dict)
            picked = torch.gather(model(x), 1, y[:, None]).mean() + model(x).gather(1, y[:, None]).mean()
            loss = reduce(criterion(model(x), y)[None], "b -> ", "mean") + picked
            mean_loss = utils.all_reduce_mean(float(len(y)))
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        False,
    ),
    "collective-named-for-what-it-does": (
        """
        from mpi_tools import mpi_avg_grads
        for x, y in loader:
            opt.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            mpi_avg_grads(model)  # here
            opt.step()
        """,
        """
        from dist_utils import all_gather
        for x, y in loader:
            opt.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
            stats = all_gather({"loss": float(loss.item()), "n": 1})
        """,
        False,
    ),
    "accelerate-gather": (
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            accelerator.backward(loss)
            opt.step(); opt.zero_grad()
            avg = accelerator.gather(loss.detach())  # here
        """,
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            accelerator.backward(loss)
            opt.step(); opt.zero_grad()
        avg = accelerator.gather(loss.detach())
        """,
        False,
    ),
}

DOC = """\
# GFY611 collective-in-step

*Category: distributed · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

`torch.distributed` collectives, point-to-point ops and barriers inside the per-iteration region of a training
loop: `all_reduce`, `all_gather`(`_into_tensor`, `_object`), `reduce_scatter`(`_tensor`), `broadcast`(`_object_list`),
`reduce`, `gather`, `scatter`, `all_to_all`(`_single`), `send`/`recv`/`isend`/`irecv`, `barrier()`; and accelerate's
`accelerator.gather`(`_for_metrics`), `reduce`, `pad_across_processes`, `wait_for_everyone()`; and a helper of
another file, which the analysis does not follow, named for a collective and handed a tensor
(`utils.reduce_dict(loss_dict)`, `reduce_tensor(loss.data, world_size)`, `concat_all_gather(keys)`). Not flagged:
collectives in setup code or between epochs, DDP's own gradient all-reduce (GFY613), and bare `reduce`/`gather`
(einops, functools, `torch.gather`).

## Why it breaks capture

Only NCCL collectives can be captured, with NCCL 2.9.6 or later, and only after setup that graphify does not check:
async error handling must be off before `init_process_group` (`TORCH_NCCL_ASYNC_ERROR_HANDLING=0`, formerly
`NCCL_ASYNC_ERROR_HANDLING`), since its watchdog tracks each collective's CUDA work, which does not fit work recorded
once and replayed; and every rank must capture and replay the same collectives in the same order. `barrier()`
blocks the host until every rank arrives, which capture forbids; gloo collectives run on the CPU and are not recorded.

## How to fix

Use the NCCL backend, set the environment variable before `init_process_group`, warm up on a side stream, and keep
barriers out of the step (between epochs). All-reduce logging metrics after the replay, on the static outputs, or
every N steps. Where that setup is not possible, capture only the compute (`torch.cuda.make_graphed_callables`) and
keep the collectives eager.

## Example

Flagged:
```python
for x, y in loader:
    criterion(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad); p.grad /= world_size
    opt.step(); opt.zero_grad()
    dist.barrier()
```
Instead (capturable once the NCCL setup is in place):
```python
os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"    # before init_process_group
dist.init_process_group("nccl")
for x, y in loader:
    criterion(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad); p.grad /= world_size  # graphify: ignore[GFY611]
    opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY611]` to the flagged line.
"""
