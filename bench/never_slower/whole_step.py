"""Small MLP regression trained with Adam: the whole step is captured (CapturedStep)."""

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--width", type=int, default=256)
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
features = torch.randn(4096, 64)
targets = features[:, :8].sum(1, keepdim=True).tanh()
loader = DataLoader(TensorDataset(features, targets), batch_size=64, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 1)).to(
    device
)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

marks = []
done = 0
sync()
started = time.perf_counter()
while done < args.steps:
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done += 1
        if done == args.steps // 2:
            sync()
            marks.append(time.perf_counter())
        if done == args.steps:
            break
sync()
ended = time.perf_counter()
print(f"loss {loss.item():.6f}")
print(f"loop s {ended - started:.4f} steady ms/step {(ended - marks[0]) * 1e3 / (args.steps - args.steps // 2):.4f}")
