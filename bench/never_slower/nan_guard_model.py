"""Small MLP classifier trained with a NaN guard that reads the loss on the host every step: the whole step is
refused, and only the model's forward and backward are graphed (GraphedModule) beside eager code."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from loop_timer import LoopTimer

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--width", type=int, default=128)
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
features = torch.randn(4096, 32)
labels = (features[:, :4].sum(1) > 0).long()
loader = DataLoader(TensorDataset(features, labels), batch_size=64, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(32, args.width), nn.ReLU(), nn.Linear(args.width, 2)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

done = 0
skipped = 0
timer = LoopTimer(args.steps)
while done < args.steps:
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        if torch.isnan(loss):
            skipped += 1
            optimizer.zero_grad()
            continue
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done += 1
        if done == args.steps // 2:
            timer.halfway()
        if done == args.steps:
            break
timer.stop()
print(f"loss {loss.item():.6f} skipped {skipped}")
timer.report()
