"""cnn_large: ResNet-18-style network, batch 256 at 64x64, SGD with momentum, bf16 autocast.
Compute-bound: CUDA graphs should not help."""

import os
import warnings

import torch
from torch import nn

SEED = 0
NUM_BATCHES = 8
BATCH = 256
IMAGE = 64
CLASSES = 100
# bf16 autocast on by default; GRAPHIFY_BENCH_CNN_LARGE_FP32=1 trains in float32 instead.
USE_BF16 = os.environ.get("GRAPHIFY_BENCH_CNN_LARGE_FP32", "0") != "1"


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNetish(nn.Module):
    def __init__(self, widths=(64, 128, 256, 512), blocks=2):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, padding=1, bias=False),  # full 64x64 resolution in stage 1
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
        )
        stages = []
        cin = widths[0]
        for i, width in enumerate(widths):
            for j in range(blocks):
                stride = 2 if (i > 0 and j == 0) else 1
                stages.append(BasicBlock(cin, width, stride))
                cin = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, CLASSES)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def build(device):
    device = torch.device(device)
    torch.manual_seed(SEED)
    # built and filled directly on the device: millions of values are slow to make on the host
    with device:
        model = ResNetish()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator(device=device).manual_seed(SEED + 1)
    batches = [
        (
            torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen, device=device),
            torch.randint(0, CLASSES, (BATCH,), generator=gen, device=device),
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
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=USE_BF16):
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

    # 3 real training steps on a side stream (cuDNN plans, optimizer state, allocator pools).
    warmup = min(warmup, steps)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*capturable=True.*")
        for step in range(warmup):
            x, y = batches[step % len(batches)]
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=USE_BF16, cache_enabled=False):
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
        # autocast's weight-cast cache must be off inside a capture
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=USE_BF16, cache_enabled=False):
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
