"""tiny: 2-layer MLP, batch 8, plain SGD. Launch-bound: each kernel does almost no work."""

import warnings

import torch
from torch import nn

SEED = 0
NUM_BATCHES = 8
BATCH = 8
IN_FEATURES = 64
HIDDEN = 128
CLASSES = 10


def build(device):
    device = torch.device(device)
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(SEED + 1)
    batches = [
        (
            torch.randn(BATCH, IN_FEATURES, generator=gen).to(device),
            torch.randint(0, CLASSES, (BATCH,), generator=gen).to(device),
        )
        for _ in range(NUM_BATCHES)
    ]
    return {
        "model": model,
        "optimizer": optimizer,
        "scheduler": None,
        "loss_fn": nn.CrossEntropyLoss(),
        "batches": batches,
    }


def train(model, optimizer, scheduler, loss_fn, batches, steps):
    model.train()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def train_hand(model, optimizer, scheduler, loss_fn, batches, steps, warmup=3):
    """Whole training step captured by hand in one CUDA graph; same updates as train()."""
    model.train()
    for group in optimizer.param_groups:
        if "capturable" in group:  # SGD has no step-count state and needs no flag
            group["capturable"] = True

    # 3 real training steps on a side stream (cuBLAS workspaces, optimizer state, allocator pools).
    warmup = min(warmup, steps)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*capturable=True.*")
        for step in range(warmup):
            x, y = batches[step % len(batches)]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
    torch.cuda.current_stream().wait_stream(side)
    # drop the last warmup autograd graph: capture must build fresh AccumulateGrad nodes on its
    # own stream instead of reusing ones tied to the side stream
    loss = None
    if warmup == steps:
        return

    static_x = torch.empty_like(batches[0][0])
    static_y = torch.empty_like(batches[0][1])
    # Tensor LRs read by the graph; the scheduler keeps stepping the float LRs in param_groups and
    # the tensors are refreshed from them before each replay.
    float_lrs = [group["lr"] for group in optimizer.param_groups]
    lr_tensors = []
    if scheduler is not None:
        lr_tensors = [torch.tensor(float(lr), device=static_x.device) for lr in float_lrs]
        for group, lr_tensor in zip(optimizer.param_groups, lr_tensors):
            group["lr"] = lr_tensor

    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)  # grads are then allocated from the graph's pool
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        optimizer.step()
    for group, lr in zip(optimizer.param_groups, float_lrs):
        group["lr"] = lr

    for step in range(warmup, steps):
        x, y = batches[step % len(batches)]
        static_x.copy_(x)
        static_y.copy_(y)
        for group, lr_tensor in zip(optimizer.param_groups, lr_tensors):
            lr_tensor.fill_(group["lr"])
        graph.replay()
        if scheduler is not None:
            scheduler.step()
