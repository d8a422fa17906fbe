"""DistributedDataParallel benchmark: a 5-layer MLP trained with Adam under torchrun, as a user writes it.

`graphify rewrite` captures its step (DDP built on the capture stream); scripts/ddp-check runs this file
and its rewrite on every GPU and compares the final weights and the time per step.
With `--accum K`, each step accumulates K micro-batches and DDP all-reduces on the last one only
(`require_backward_grad_sync`, switched by the micro-step counter): the step holds the whole cycle.
Usage: torchrun --standalone --nproc_per_node=2 bench/ddp/mlp_ddp.py [--steps 400] [--optimizer adam|sgd] [--capturable] [--accum K]
"""

import argparse
import itertools
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--timed-from", type=int, default=100)
parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
parser.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
parser.add_argument(
    "--capturable",
    action="store_true",
    help="Adam's capturable code path with a device-tensor learning rate in eager too (what a captured step runs)",
)
args = parser.parse_args()

rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank)
dist.init_process_group("nccl")
torch.manual_seed(0)

model = nn.Sequential(*[layer for _ in range(4) for layer in (nn.Linear(256, 256), nn.ReLU())], nn.Linear(256, 10)).to(device)
model = DDP(model, device_ids=[local_rank])
if args.optimizer == "adam":
    # a float learning rate and a tensor one round Adam's step size apart, which 400 steps on 16 batches amplify
    lr = torch.tensor(1e-3, device=device) if args.capturable else 1e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, capturable=args.capturable)
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

generator = torch.Generator().manual_seed(rank)
batches = [(torch.randn(64, 256, generator=generator), torch.randint(0, 10, (64,), generator=generator)) for _ in range(16)]

stream = itertools.cycle(batches)
start = None
for step in range(args.steps):
    if step == args.timed_from:
        torch.cuda.synchronize()
        start = time.perf_counter()
    optimizer.zero_grad()
    for micro_step in range(args.accum):
        model.require_backward_grad_sync = micro_step == args.accum - 1
        x, y = next(stream)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y) / args.accum
        loss.backward()
    optimizer.step()
torch.cuda.synchronize()
ms = (time.perf_counter() - start) * 1e3 / (args.steps - args.timed_from)

weights = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
if rank == 0:
    print(f"ms/step {ms:.4f}")
    print(f"final weights: sum {weights.sum().item():.12e} norm {weights.norm().item():.12e}")
dist.destroy_process_group()
