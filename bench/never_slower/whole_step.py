"""Small MLP regression trained with Adam: the whole step is captured (CapturedStep)."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from loop_timer import LoopTimer

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--width", type=int, default=256)
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
features = torch.randn(4096, 64)
targets = features[:, :8].sum(1, keepdim=True).tanh()
loader = DataLoader(TensorDataset(features, targets), batch_size=64, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 1)).to(
    device
)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

done = 0
timer = LoopTimer(args.steps)
while done < args.steps:
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done += 1
        if done == args.steps // 2:
            timer.halfway()
        if done == args.steps:
            break
timer.stop()
print(f"loss {loss.item():.6f}")
timer.report()
