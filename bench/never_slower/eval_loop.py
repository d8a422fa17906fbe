"""Evaluation of a small CNN over a test set, loss and accuracy summed on the host per batch: the loop is
rewritten whole (an inference step, CapturedStep under no_grad)."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from loop_timer import LoopTimer

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--channels", type=int, default=16)
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
images = torch.randn(2048, 3, 32, 32)
labels = torch.randint(0, 10, (2048,))
loader = DataLoader(TensorDataset(images, labels), batch_size=128, drop_last=True)
c = args.channels
model = nn.Sequential(
    nn.Conv2d(3, c, 3, padding=1),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Conv2d(c, 2 * c, 3, padding=1),
    nn.ReLU(),
    nn.AdaptiveAvgPool2d(1),
    nn.Flatten(),
    nn.Linear(2 * c, 10),
).to(device)
model.eval()

done = 0
total_loss, correct, seen = 0.0, 0, 0
timer = LoopTimer(args.steps)
with torch.no_grad():
    while done < args.steps:
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            out = model(x)
            total_loss += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
            seen += y.numel()
            done += 1
            if done == args.steps // 2:
                timer.halfway()
            if done == args.steps:
                break
timer.stop()
print(f"loss {total_loss / seen:.6f} accuracy {correct / seen:.4f}")
timer.report()
