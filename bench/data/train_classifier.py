"""A typical ~300-line image-classification training script, the input of bench/check_speed.py's
single-file (pre-commit) measurement. It is never run by the benchmark, only checked."""

import argparse
import json
import math
import os
import random
import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


@dataclass
class Config:
    data_dir: str = "data"
    out_dir: str = "runs/exp"
    epochs: int = 30
    batch_size: int = 128
    lr: float = 3e-4
    weight_decay: float = 0.05
    warmup_steps: int = 500
    grad_clip: float = 1.0
    label_smoothing: float = 0.1
    num_classes: int = 100
    image_size: int = 32
    amp: bool = True
    log_every: int = 50
    eval_every: int = 1
    seed: int = 0
    workers: int = 4
    tags: list = field(default_factory=list)


def parse_args() -> Config:
    parser = argparse.ArgumentParser(description="Train a small convnet classifier.")
    cfg = Config()
    for name, value in vars(cfg).items():
        if isinstance(value, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=value)
        elif isinstance(value, list):
            parser.add_argument(f"--{name.replace('_', '-')}", nargs="*", default=value)
        else:
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args()
    return Config(**vars(args))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


class SyntheticImages(Dataset):
    """Random images with a learnable signal, so the script runs without downloads."""

    def __init__(self, n: int, num_classes: int, size: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, num_classes, (n,), generator=g)
        self.protos = torch.randn(num_classes, 3, size, size, generator=g)
        self.noise_seed = seed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.noise_seed * 1_000_003 + i)
        y = self.labels[i]
        x = self.protos[y] + 0.5 * torch.randn(self.protos.shape[1:], generator=g)
        return x, y


class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.skip is None else self.skip(x)))


class Net(nn.Module):
    def __init__(self, num_classes: int, width: int = 64):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layers = nn.Sequential(
            ConvBlock(width, width),
            ConvBlock(width, 2 * width, 2),
            ConvBlock(2 * width, 2 * width),
            ConvBlock(2 * width, 4 * width, 2),
            ConvBlock(4 * width, 4 * width),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


class AverageMeter:
    def __init__(self):
        self.total = 0.0
        self.count = 0

    def update(self, value: float, n: int = 1) -> None:
        self.total += value * n
        self.count += n

    @property
    def avg(self) -> float:
        return self.total / max(self.count, 1)


def cosine_with_warmup(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def accuracy(logits, target, topk=(1, 5)):
    maxk = max(topk)
    _, pred = logits.topk(maxk, 1, True, True)
    correct = pred.t().eq(target.view(1, -1))
    return [correct[:k].reshape(-1).float().sum(0) * (100.0 / target.size(0)) for k in topk]


def build_optimizer(model: nn.Module, cfg: Config):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name.endswith(".bias") else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999))


def save_checkpoint(path: str, model, optimizer, scheduler, scaler, epoch: int, best: float) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "epoch": epoch,
            "best": best,
        },
        path,
    )


def train_one_epoch(model, loader, optimizer, scheduler, scaler, criterion, device, epoch, cfg, history):
    model.train()
    loss_meter = AverageMeter()
    acc_meter = AverageMeter()
    start = time.time()
    for step, (images, targets) in enumerate(loader):
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=cfg.amp):
            logits = model(images)
            loss = criterion(logits, targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()

        top1, _ = accuracy(logits.detach(), targets)
        loss_meter.update(loss.item(), images.size(0))
        acc_meter.update(top1.item(), images.size(0))
        if not torch.isfinite(loss):
            raise RuntimeError(f"loss is {loss} at epoch {epoch} step {step}")
        if step % cfg.log_every == 0:
            lr = optimizer.param_groups[0]["lr"]
            elapsed = time.time() - start
            print(
                f"epoch {epoch} step {step}/{len(loader)} loss {loss_meter.avg:.4f} "
                f"acc {acc_meter.avg:.2f} lr {lr:.2e} grad {grad_norm:.3f} {elapsed:.1f}s"
            )
            history.append({"epoch": epoch, "step": step, "loss": loss_meter.avg, "lr": lr})
    return loss_meter.avg, acc_meter.avg


@torch.no_grad()
def evaluate(model, loader, criterion, device):
    model.eval()
    loss_meter = AverageMeter()
    top1_meter = AverageMeter()
    top5_meter = AverageMeter()
    for images, targets in loader:
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        logits = model(images)
        loss = criterion(logits, targets)
        top1, top5 = accuracy(logits, targets)
        loss_meter.update(loss.item(), images.size(0))
        top1_meter.update(top1.item(), images.size(0))
        top5_meter.update(top5.item(), images.size(0))
    return loss_meter.avg, top1_meter.avg, top5_meter.avg


def make_loaders(cfg: Config):
    train_set = SyntheticImages(50_000, cfg.num_classes, cfg.image_size, cfg.seed)
    val_set = SyntheticImages(10_000, cfg.num_classes, cfg.image_size, cfg.seed + 1)
    train_loader = DataLoader(
        train_set,
        batch_size=cfg.batch_size,
        shuffle=True,
        num_workers=cfg.workers,
        pin_memory=True,
        drop_last=True,
        persistent_workers=cfg.workers > 0,
    )
    val_loader = DataLoader(val_set, batch_size=2 * cfg.batch_size, shuffle=False, num_workers=cfg.workers)
    return train_loader, val_loader


def main() -> None:
    cfg = parse_args()
    seed_everything(cfg.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True

    train_loader, val_loader = make_loaders(cfg)
    model = Net(cfg.num_classes).to(device, memory_format=torch.channels_last)
    optimizer = build_optimizer(model, cfg)
    total_steps = cfg.epochs * len(train_loader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_with_warmup(s, total_steps, cfg.warmup_steps))
    scaler = torch.cuda.amp.GradScaler(enabled=cfg.amp)
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)

    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(os.path.join(cfg.out_dir, "config.json"), "w") as f:
        json.dump(vars(cfg), f, indent=2)

    best = 0.0
    history = []
    for epoch in range(cfg.epochs):
        t0 = time.time()
        train_loss, train_acc = train_one_epoch(model, train_loader, optimizer, scheduler, scaler, criterion, device, epoch, cfg, history)
        if (epoch + 1) % cfg.eval_every == 0:
            val_loss, top1, top5 = evaluate(model, val_loader, criterion, device)
            print(
                f"epoch {epoch}: train {train_loss:.4f}/{train_acc:.2f} "
                f"val {val_loss:.4f} top1 {top1:.2f} top5 {top5:.2f} ({time.time() - t0:.0f}s)"
            )
            if top1 > best:
                best = top1
                save_checkpoint(os.path.join(cfg.out_dir, "best.pt"), model, optimizer, scheduler, scaler, epoch, best)
        save_checkpoint(os.path.join(cfg.out_dir, "last.pt"), model, optimizer, scheduler, scaler, epoch, best)

    with open(os.path.join(cfg.out_dir, "history.json"), "w") as f:
        json.dump(history, f)
    print(f"best top1 {best:.2f}")


if __name__ == "__main__":
    main()
