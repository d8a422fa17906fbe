"""Flagged and clean forms of rule patterns that a doc example does not cover, each rule's `CASES` (those
of a family not yet split into rule modules: CASES below): each flagged case reports its code on the line
marked `# here`, each clean case reports it nowhere. The line is where the flagged code stands: in a
function the loop calls, the helper's line (the diagnostic itself stands at the call)."""

import textwrap

import pytest

import graphify.rules
from graphify.config import Settings
from graphify.engine import analyze_source

_HEADER = """\
import os, random, shutil
import timm.scheduler, timm.utils
import numpy as np
import torch
import torchvision
import torch.nn as nn
from accelerate import Accelerator
from torchvision.utils import save_image
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
accelerator = Accelerator()
"""

CASES = {
    "GFY401-any-branch-of-a-choice": (
        "GFY401",
        """
        def build(kind, params):
            if kind == "adamw":
                optimizer = torch.optim.AdamW(params)  # here
            elif kind == "sgd":
                optimizer = torch.optim.SGD(params, lr=0.1)
            return optimizer
        optimizer = build("adamw", model.parameters())
        scaled = torch.optim.Adam(model.parameters()) if len(os.environ) else None  # here
        optimizer_cls = torch.optim.Adam
        head_optimizer = optimizer_cls(model.parameters())  # here
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step(); scaled.step(); head_optimizer.step()
        """,
        """
        def build(kind, params):
            if kind == "adamw":
                optimizer = torch.optim.AdamW(params, capturable=True)
            elif kind == "sgd":
                optimizer = torch.optim.SGD(params, lr=0.1)
            return optimizer
        optimizer = build("adamw", model.parameters())
        scaled = torch.optim.Adam(model.parameters(), capturable=True) if len(os.environ) else None
        optimizer_cls = torch.optim.SGD
        head_optimizer = optimizer_cls(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step(); scaled.step(); head_optimizer.step()
        """,
    ),
    "GFY251-loader-from-tuple-and-prepare": (
        "GFY251",
        """
        def get_loaders(ds):
            train = torch.utils.data.DataLoader(ds, batch_size=8, drop_last=True)
            valid = torch.utils.data.DataLoader(ds, batch_size=8)  # here
            return train, valid
        train_dl, valid_dl = get_loaders(None)
        model, train_dl, valid_dl = accelerator.prepare(model, train_dl, valid_dl)
        with torch.no_grad():
            for x, y in valid_dl:
                out = model(x)
        """,
        """
        def get_loaders(ds):
            train = torch.utils.data.DataLoader(ds, batch_size=8, drop_last=True)
            valid = torch.utils.data.DataLoader(ds, batch_size=8, drop_last=True)
            return train, valid
        train_dl, valid_dl = get_loaders(None)
        model, train_dl, valid_dl = accelerator.prepare(model, train_dl, valid_dl)
        with torch.no_grad():
            for x, y in valid_dl:
                out = model(x)
        """,
    ),
    "GFY251-loader-attribute-from-init": (
        "GFY251",
        """
        class Trainer:
            def __init__(self, ds):
                dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)  # here
                self.dl = iter(accelerator.prepare(dl))
            def train(self):
                for _ in range(100):
                    x, y = next(self.dl)
                    loss = criterion(model(x), y)
                    loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        class Trainer:
            def __init__(self, ds):
                dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, drop_last=True)
                self.dl = iter(accelerator.prepare(dl))
            def train(self):
                for _ in range(100):
                    x, y = next(self.dl)
                    loss = criterion(model(x), y)
                    loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY251-loader-handed-down-two-calls": (
        "GFY251",
        """
        def train_epoch(model, loader):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
        def train(model, loader, epochs):
            for epoch in range(epochs):
                train_epoch(model, loader)
        def main():
            loader = torch.utils.data.DataLoader(None, batch_size=8, shuffle=True)  # here
            train(model, loader, 10)
        """,
        """
        def train_epoch(model, loader):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
        def train(model, loader, epochs):
            for epoch in range(epochs):
                train_epoch(model, loader)
        def main():
            loader = torch.utils.data.DataLoader(None, batch_size=8, shuffle=True, drop_last=True)
            train(model, loader, 10)
        """,
    ),
    "GFY009-mask-made-by-a-method": (
        "GFY009",
        """
        for x, labels in loader:
            sim = model(x) @ model(x).T
            positives = sim[labels.bool()]  # here
            loss = -positives.mean()
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        for x, labels in loader:
            sim = model(x) @ model(x).T
            positives = sim[labels.long()]
            loss = -positives.mean()
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY009-indexes-where-a-condition-holds": (
        "GFY009",
        """
        for x, labels in loader:
            logits = model(x)
            indices = np.where(labels.cpu().numpy() != 0)
            loss = criterion(logits[indices], labels[indices])  # here
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        for x, labels in loader:
            logits = model(x)
            weights = np.where(labels.cpu().numpy() != 0, 1.0, 0.5)
            loss = criterion(logits, labels)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY253-dgl-blocks-through-enumerate": (
        "GFY253",
        """
        from dgl.dataloading import DataLoader, NeighborSampler
        def train(g, idx):
            loader = DataLoader(g, idx, NeighborSampler([10, 10]), batch_size=1024, drop_last=True)
            for it, (input_nodes, output_nodes, blocks) in enumerate(loader):
                x = blocks[0].srcdata["feat"]  # here
                loss = criterion(model(blocks, x), blocks[-1].dstdata["label"])
                loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def train(x_all, y_all):
            loader = torch.utils.data.DataLoader(list(zip(x_all, y_all)), batch_size=1024, drop_last=True)
            for it, (x, y) in enumerate(loader):
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY253-pyg-loader-in-a-helper-argument": (
        "GFY253",
        """
        import torch_geometric.loader
        def train_epoch(loader):
            for batch in loader:
                pred = model(batch.x)  # here
                loss = criterion(pred, batch.y)
                loss.backward(); opt.step(); opt.zero_grad()
        train_epoch(torch_geometric.loader.NeighborLoader(None, num_neighbors=[10], batch_size=64))
        """,
        """
        def train_epoch(graph):
            for epoch in range(10):
                pred = model(graph.x)
                loss = criterion(pred, graph.y)
                loss.backward(); opt.step(); opt.zero_grad()
        train_epoch(None)
        """,
    ),
    "GFY252-torchtext-bucket-iterator": (
        "GFY252",
        """
        from torchtext.data import BucketIterator, Iterator
        def loaders(train_set, valid_set):
            return BucketIterator(train_set, batch_size=64, train=True), Iterator(valid_set, batch_size=64)  # here
        def train_epoch(model, data):
            for batch in data:
                loss = criterion(model(batch.src), batch.trg)
                loss.backward(); opt.step(); opt.zero_grad()
        train_data, valid_data = loaders(None, None)
        train_epoch(model, train_data)
        """,
        """
        from torchtext.data import BucketIterator, Iterator
        def loaders(train_set, valid_set):
            return BucketIterator(train_set, batch_size=64, train=True), Iterator(valid_set, batch_size=64)
        def train_epoch(model, data):
            for batch in data:
                loss = criterion(model(batch.src), batch.trg)
                loss.backward(); opt.step(); opt.zero_grad()
        train_data, valid_data = loaders(None, None)
        train_epoch(model, valid_data)
        """,
    ),
    "GFY252-collate-nested-in-loader-function": (
        "GFY252",
        """
        def get_loader(ds, tokenizer):
            def collate(examples):
                return tokenizer.pad(examples, padding="longest", return_tensors="pt")  # here
            return torch.utils.data.DataLoader(ds, collate_fn=collate, drop_last=True)
        loader = get_loader(None, None)
        for batch in loader:
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def get_loader(ds, tokenizer):
            def collate(examples):
                return tokenizer.pad(examples, padding="max_length", max_length=128, return_tensors="pt")
            return torch.utils.data.DataLoader(ds, collate_fn=collate, drop_last=True)
        loader = get_loader(None, None)
        for batch in loader:
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY612-no-sync-kept-and-fsdp-toggle": (
        "GFY612",
        """
        import contextlib
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % 4 == 0
            model.set_requires_gradient_sync(last)  # here
            ctx = model.no_sync() if not last else contextlib.nullcontext()  # here
            with ctx:
                criterion(model(x), y).backward()
            if last:
                opt.step(); opt.zero_grad()
        """,
        """
        for i, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            if (i + 1) % 4 == 0:
                opt.step(); opt.zero_grad()
        """,
    ),
    "GFY612-sync-flag-on-the-loop-counter-or-a-changing-count": (
        "GFY612",
        """
        import contextlib
        accum = 4
        for i, batch in enumerate(loader):
            model.require_backward_grad_sync = (i + 1) % accum == 0  # here
            criterion(model(batch[0]), batch[1]).backward()
            if (i + 1) % accum == 0:
                opt.step(); opt.zero_grad()
        for i, chunks in enumerate(loader):
            for k in range(len(chunks)):
                ctx = model.no_sync() if k < len(chunks) - 1 else contextlib.nullcontext()  # here
                with ctx:
                    criterion(model(chunks[k]), chunks[k]).backward()
            opt.step(); opt.zero_grad()
        """,
        """
        import contextlib
        accum = 4
        for i, batch in enumerate(loader):
            for micro in range(accum):
                model.require_backward_grad_sync = micro == accum - 1
                criterion(model(batch[micro]), batch[micro]).backward()
            opt.step(); opt.zero_grad()
        for i, batch in enumerate(loader):
            for micro in range(0, accum):
                with model.no_sync() if micro + 1 < accum else contextlib.nullcontext():
                    criterion(model(batch[micro]), batch[micro]).backward()
            opt.step(); opt.zero_grad()
        """,
    ),
    "GFY412-callable-scheduler-and-lr-helper": (
        "GFY412",
        """
        import lr_sched
        scheduler = lr_sched.cosine_lr(opt, 0.1, 100, 1000)
        for i, (x, y) in enumerate(loader):
            scheduler(i)  # here
            lr_sched.adjust_learning_rate(opt, i)  # here
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        import lr_sched
        scheduler = lr_sched.cosine_lr(opt, 0.1, 100, 1000)
        for i, (x, y) in enumerate(loader):
            lr = scheduler(i)
            lr_sched.adjust_learning_rate(lr, i)
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY511-logger-from-factory": (
        "GFY511",
        """
        import tracking
        wb = tracking.get_wandb_backend()
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            wb.log({"lr": 0.1})  # here
        """,
        """
        import tracking
        wb = tracking.get_model_backend()
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            wb.log({"lr": 0.1})
        """,
    ),
    "GFY501-early-return-in-called-step": (
        "GFY501",
        """
        def train_step(x, y, pending):
            with torch.no_grad():
                pending.append(model(x))
            if len(pending) < 4:  # here
                return pending
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
            return []
        pending = []
        for x, y in loader:
            pending = train_step(x, y, pending)
        """,
        """
        def train_step(x, y, pending):
            if x is None:
                return pending
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
            return []
        pending = []
        for x, y in loader:
            pending = train_step(x, y, pending)
        """,
    ),
    "GFY611-loss-module-handed-to-the-loop": (
        "GFY611",
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
    ),
    "GFY512-save-helper-in-periodic-work": (
        "GFY512",
        """
        def save(step):
            torch.save(model.state_dict(), f"ckpt-{step}.pt")  # here
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            if i % 1000 == 0:
                model.eval()
                with torch.no_grad():
                    sample = model(x)
                save(i)
        """,
        """
        def save(step):
            print(f"ckpt-{step}.pt")
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            if i % 1000 == 0:
                model.eval()
                with torch.no_grad():
                    sample = model(x)
                save(i)
        """,
    ),
    "GFY006-tensor-dict-logged": (
        "GFY006",
        """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            log_dict = {"loss": loss.detach(), "step": step}
            metric_logger.log_dict(log_dict, step=step)  # here
        """,
        """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            log_dict = {"loss": float(loss), "step": step}
            metric_logger.log_dict(log_dict, step=step)
        """,
    ),
    "GFY303-list-of-labels": (
        "GFY303",
        """
        valid_labels = [int(line) for line in open("labels.txt")] if os.path.exists("labels.txt") else None
        with torch.no_grad():
            for x, y in loader:
                output = model(x)
                if valid_labels is not None:
                    output = output[:, valid_labels]  # here
                loss = criterion(output, y)
        """,
        """
        valid_labels = torch.tensor([int(line) for line in open("labels.txt")], device="cuda")
        with torch.no_grad():
            for x, y in loader:
                output = model(x)
                output = output[:, valid_labels]
                first = output[:, [k for k in range(2)]]
                loss = criterion(output, y)
        """,
    ),
    "GFY003-evaluate-metric": (
        "GFY003",
        """
        import evaluate
        metric = evaluate.load("accuracy")
        with torch.no_grad():
            for x, y in loader:
                predictions = model(x).argmax(dim=-1)
                metric.add_batch(predictions=predictions, references=y)  # here
        """,
        """
        import evaluate
        metric = evaluate.load("accuracy")
        correct = []
        with torch.no_grad():
            for x, y in loader:
                predictions = model(x).argmax(dim=-1)
                correct.append(predictions == y)
        metric.add_batch(predictions=predictions, references=y)
        """,
    ),
    "GFY003-module-offloaded": (
        "GFY003",
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            ema_model.to("cuda", non_blocking=True)
            update_ema(ema_model, model)
            ema_model.to("cpu", non_blocking=True)  # here
        """,
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            update_ema(ema_model, model)
        ema_model.to("cpu")
        """,
    ),
    "GFY301-module-brought-back": (
        "GFY301",
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            ema_model.to(device="cuda", non_blocking=True)  # here
            update_ema(ema_model, model)
            ema_model.to(device="cpu", non_blocking=True)
        """,
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            ema_model.to(device="cuda", non_blocking=True)
            update_ema(ema_model, model)
        """,
    ),
    "GFY301-mapped-lambda": (
        "GFY301",
        """
        for batch in loader:
            x, y = map(lambda t: t.to(device), batch)  # here
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        for batch in loader:
            x, y = map(lambda t: t.float(), batch)
            to_device = lambda t: t.to(device)
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY003-host-batch-indexed-on-device": (
        "GFY003",
        """
        loader = torch.utils.data.DataLoader(dataset, batch_size=8)
        with torch.no_grad():
            for imgs, caps in loader:
                out, order = model(imgs.to(device))
                caps = caps[order]  # here
        """,
        """
        loader = torch.utils.data.DataLoader(dataset, batch_size=8)
        with torch.no_grad():
            for imgs, caps in loader:
                caps = caps.to(device)
                out, order = model(imgs.to(device))
                caps = caps[order]
        """,
    ),
    "GFY002-host-batch-item": (
        "GFY002",
        """
        loader = torch.utils.data.DataLoader(dataset, batch_size=8)
        with torch.no_grad():
            for imgs, caps in loader:
                out = model(imgs.to(device))
                refs = caps[0].tolist()
                hyps = out.argmax(-1).tolist()  # here
        """,
        """
        loader = torch.utils.data.DataLoader(dataset, batch_size=8)
        with torch.no_grad():
            for imgs, caps in loader:
                out = model(imgs.to(device))
                refs = caps[0].tolist()
        """,
    ),
    "GFY611-collective-helper-of-another-file": (
        "GFY611",
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
    ),
    "GFY611-accelerate-gather": (
        "GFY611",
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
    ),
    "GFY501-accelerate-accumulate": (
        "GFY501",
        """
        for x, y in loader:
            with accelerator.accumulate(model):  # here
                loss = criterion(model(x), y)
                accelerator.backward(loss)
                opt.step(); opt.zero_grad()
        """,
        """
        for x, y in loader:
            with accelerator.autocast():
                loss = criterion(model(x), y)
            accelerator.backward(loss)
            opt.step(); opt.zero_grad()
        """,
    ),
    "GFY252-collate-pad-sequence": (
        "GFY252",
        """
        def collate(batch):
            xs, ys = zip(*batch)
            return nn.utils.rnn.pad_sequence(xs, batch_first=True), torch.stack(ys)  # here
        loader = torch.utils.data.DataLoader(data, batch_size=8, drop_last=True, collate_fn=collate)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def collate(batch):
            xs, ys = zip(*batch)
            return torch.stack([nn.functional.pad(x, (0, 64 - len(x))) for x in xs]), torch.stack(ys)
        loader = torch.utils.data.DataLoader(data, batch_size=8, drop_last=True, collate_fn=collate)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY252-collate-tokenizer-pad": (
        "GFY252",
        """
        def collate(examples):
            return tokenizer.pad(examples, padding="longest", return_tensors="pt")  # here
        loader = torch.utils.data.DataLoader(data, batch_size=8, drop_last=True, collate_fn=collate)
        for batch in loader:
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def collate(examples):
            return tokenizer.pad(examples, padding="max_length", max_length=128, return_tensors="pt")
        loader = torch.utils.data.DataLoader(data, batch_size=8, drop_last=True, collate_fn=collate)
        for batch in loader:
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY252-padding-collator": (
        "GFY252",
        """
        collator = None
        loader = torch.utils.data.DataLoader(data, batch_size=8, drop_last=True, collate_fn=DataCollatorWithPadding(tokenizer))  # here
        for batch in loader:
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        loader = torch.utils.data.DataLoader(
            data, batch_size=8, drop_last=True, collate_fn=DataCollatorWithPadding(tokenizer, padding="max_length", max_length=128)
        )
        for batch in loader:
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY502-sync-gradients": (
        "GFY502",
        """
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = criterion(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:  # here
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                opt.step(); opt.zero_grad()
        """,
        """
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = criterion(model(x), y)
                accelerator.backward(loss)
                opt.step(); opt.zero_grad()
            if accelerator.sync_gradients:
                print("cycle done")
        """,
    ),
    "GFY512-checkpoint-rotation": (
        "GFY512",
        """
        for step, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
            if step % 100 == 0:
                shutil.rmtree(f"ckpt-{step - 300}", ignore_errors=True)  # here
        """,
        """
        for step, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        shutil.rmtree("ckpt-old", ignore_errors=True)
        """,
    ),
    "GFY512-save-function": (
        "GFY512",
        """
        for step, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
            if step % 100 == 0:
                torchvision.utils.save_image(x, f"batch-{step}.png")  # here
        """,
        """
        for step, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        torchvision.utils.save_image(x, "last-batch.png")
        """,
    ),
    "GFY512-file-write": (
        "GFY512",
        """
        with open("losses.txt", "w") as out:
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
                out.write("step\\n")  # here
        """,
        """
        with open("losses.txt", "w") as out:
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
            out.write("done\\n")
        """,
    ),
    "GFY513-memory-history": (
        "GFY513",
        """
        for step, (x, y) in enumerate(loader):
            if step == 5:
                torch.cuda.memory._record_memory_history()  # here
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        """,
        """
        torch.cuda.memory._record_memory_history()
        for step, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        """,
    ),
    "GFY001-nested-loop-of-inference-step": (
        "GFY001",
        """
        with torch.no_grad():
            for x, y in loader:
                scores = model(x)
                for row in scores:
                    best = row.max().item()  # here
        """,
        """
        with torch.no_grad():
            for x, y in loader:
                scores = model(x)
        for row in scores:
            best = row.max().item()
        """,
    ),
    "GFY702-host-random-branch": (
        "GFY702",
        """
        for x, y in loader:
            if random.random() < 0.1:  # here
                x = x.flip(0)
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
            keep = np.random.rand() < 0.5  # here
        """,
        """
        for x, y in loader:
            scale = np.random.uniform(0.9, 1.1)
            x = x * scale
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        """,
    ),
    "GFY702-rl-env-and-replay-buffer": (
        "GFY702",
        """
        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer
        envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
        rb = ReplayBuffer(1000, envs.single_observation_space, envs.single_action_space, "cuda")
        obs, _ = envs.reset()
        for step in range(1000):
            if step < 100:
                actions = envs.single_action_space.sample()  # here
            else:
                q_values = model(torch.Tensor(obs))
                actions = q_values.argmax(1).numpy()
            next_obs, rewards, terms, truncs, infos = envs.step(actions)  # here
            rb.add(obs, next_obs, actions, rewards, terms, infos)  # here
            obs = next_obs
            data = rb.sample(32)  # here
            criterion(model(data.observations), data.actions).backward()
            opt.step(); opt.zero_grad()
        """,
        """
        import gymnasium as gym
        env = gym.make("CartPole-v1")
        obs, _ = env.reset()
        with torch.no_grad():
            for step in range(1000):
                action = model(torch.Tensor(obs)).argmax().item()
                obs, reward, term, trunc, info = env.step(action)
                if term or trunc:
                    obs, _ = env.reset()
        """,
    ),
    "GFY702-noise-drawn-after-zero-grad": (
        "GFY702",
        """
        for x, y in loader:
            opt.zero_grad()
            z = torch.from_numpy(np.random.normal(0, 1, (8, 4))).float()  # here
            criterion(model(z), y).backward()
            opt.step()
        """,
        """
        for x, y in loader:
            z = torch.from_numpy(np.random.normal(0, 1, (8, 4))).float()
            opt.zero_grad()
            criterion(model(z), y).backward()
            opt.step()
        """,
    ),
    "GFY703-param-group-hyperparameter": (
        "GFY703",
        """
        wd_schedule = np.linspace(0.04, 0.4, 1000)
        for it, (x, y) in enumerate(loader):
            for i, group in enumerate(opt.param_groups):
                group["lr"] = 0.1 / (it + 1)
                group["weight_decay"] = wd_schedule[it]  # here
            opt.param_groups[0]["momentum"] = 0.9 + it / 1e4  # here
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        """,
        """
        for epoch in range(10):
            for group in opt.param_groups:
                group["weight_decay"] = 0.1 * epoch
            for it, (x, y) in enumerate(loader):
                stats = {}
                stats["momentum"] = it / 1e4
                for group in opt.param_groups:
                    group["weight_decay"] = 0.0
                criterion(model(x), y).backward()
                opt.step(); opt.zero_grad()
        """,
    ),
    "GFY701-counter-index": (
        "GFY701",
        """
        losses = torch.zeros(100)
        for step in range(100):
            x, y = next(batches)
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            losses[step] = loss.detach()  # here
        """,
        """
        xs, ys = torch.randn(100, 8, 4), torch.randint(0, 2, (100, 8))
        for step in range(100):
            x, y = xs[step], ys[step]
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY501-step-in-called-function": (
        "GFY501",
        """
        def update(loss, do_step):
            loss.backward()
            if do_step:  # here
                opt.step(); opt.zero_grad()
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % 4 == 0
            if not last:  # here
                with model.no_sync():
                    update(criterion(model(x), y), last)
            else:
                update(criterion(model(x), y), last)
        """,
        """
        def update(loss):
            loss.backward()
            opt.step(); opt.zero_grad()
        for x, y in loader:
            if args.no_sync:
                with model.no_sync():
                    update(criterion(model(x), y))
            else:
                update(criterion(model(x), y))
        """,
    ),
    "GFY501-continue-before-step": (
        "GFY501",
        """
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            if (i + 1) % 4 != 0:  # here
                continue
            opt.step(); opt.zero_grad()
        """,
        """
        for i, (x, y) in enumerate(loader):
            if i < resume_step:
                continue
            loss = criterion(model(x), y)
            loss.backward()
            opt.step(); opt.zero_grad()
        """,
    ),
    "GFY502-target-network-copy": (
        "GFY502",
        """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            if step % 100 == 0:  # here
                for p, tp in zip(model.parameters(), target.parameters()):
                    tp.data.copy_(p.data)
        """,
        """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            if args.sync_target:
                for p, tp in zip(model.parameters(), target.parameters()):
                    tp.data.copy_(p.data)
        """,
    ),
    "GFY502-warmup-else-branch": (
        "GFY502",
        """
        for step in range(1000):
            if step < 100:  # here
                action = random.random()
            else:
                action = model(obs)
            loss = criterion(model(obs), target)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        for step in range(1000):
            if args.random_actions:
                action = random.random()
            else:
                action = model(obs)
            loss = criterion(model(obs), target)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY003-module-put-in-eval-mode": (
        "GFY003",
        """
        def evaluate(task, loader):
            task.eval()
            feats = []
            with torch.no_grad():
                for batch in loader:
                    out = task(batch)
                    feats.append(out.cpu())  # here
        """,
        """
        def evaluate(task, loader):
            feats = []
            with torch.no_grad():
                for batch in loader:
                    out = task(batch)
                    feats.append(out.cpu())
        """,
    ),
    "GFY006-concatenated-f-string": (
        "GFY006",
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            print(
                f"step "
                f"loss {loss:.3f}"  # here
            )
        """,
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            avg = round(meter.avg, 4)
            print(
                f"step "
                f"avg {avg:.3f}"
            )
        avg = torch.tensor(avg)
        """,
    ),
    "GFY301-batch-handed-to-device-helper": (
        "GFY301",
        """
        it = iter(loader)
        while True:
            batch = next(it)
            batch = task.prepare_batch(batch, device=device)  # here
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        it = iter(loader)
        while True:
            batch = next(it)
            batch = task.prepare_batch(batch, device="cpu")
            batch = collate(batch, max_len)
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY701-host-helper-feeds-step": (
        "GFY701",
        """
        def accuracy(out, y):
            return (out.argmax(1) == y).float().mean()
        for x, y in loader:
            out = model(x)
            acc = accuracy(out, y)
            meter.update(acc)
            w = lookup(table)  # here
            loss = criterion(out, y) * w
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def accuracy(out, y):
            return (out.argmax(1) == y).float().mean()
        for x, y in loader:
            out = model(x)
            acc = accuracy(out, y)
            meter.update(acc)
            loss = criterion(out, y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY703-requires-grad-of-a-module-not-a-tensor": (
        "GFY703",
        """
        for x, y in loader:
            out = model(x)
            model.requires_grad_(False)  # here
            loss = criterion(out, y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def penalty(real, fake):
            alpha = torch.rand(real.size(0), 1, device=real.device)
            mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
            grads = torch.autograd.grad(model(mixed).sum(), mixed, create_graph=True)[0]
            return ((grads.norm(2, dim=1) - 1) ** 2).mean()
        for x, y in loader:
            loss = criterion(model(x), y) + penalty(x, x.flip(0))
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY703-helper-changes-outer-list": (
        "GFY703",
        """
        history = []
        def track(out, y):
            history.append((out.argmax(1) == y).float().mean())  # here
            return out
        for x, y in loader:
            out = track(model(x), y)
            loss = criterion(out, y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def track(out, y):
            found = []
            found.append((out.argmax(1) == y).float().mean())
            return found
        for x, y in loader:
            out = model(x)
            acc = track(out, y)
            loss = criterion(out, y)
            loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY703-item-or-attribute-changed-between-steps": (
        "GFY703",
        """
        import argparse
        args = argparse.ArgumentParser().parse_args()
        weights = {"aux": 0.0}
        temps = [1.0]
        for epoch in range(4):
            args.accum = 2 + epoch  # here
            temps.append(1 / (epoch + 1))  # here
            for i, (x, y) in enumerate(loader):
                weights["aux"] = i / 100  # here
                weights.update(main=1 - i / 100)  # here
                for k in range(args.accum):
                    out = model(x[k::args.accum]) / temps[-1]
                    loss = (criterion(out, y[k::args.accum]) * weights["aux"]) * weights["main"]
                    loss.backward()
                opt.step(); opt.zero_grad()
        """,
        """
        import argparse
        args = argparse.ArgumentParser().parse_args()
        weights = {"aux": 0.5}
        logs = {}
        history = []
        scaler = torch.cuda.amp.GradScaler()
        for epoch in range(4):
            logs["epoch"] = epoch
            history.append(epoch)
            for i, batch in enumerate(loader):
                batch["scale"] = 2.0
                logs["step"] = i
                logs.update(seen=i)
                scaler.update()
                for k in range(args.accum):
                    loss = criterion(model(batch["x"][k::args.accum]), batch["y"]) * weights["aux"] * batch["scale"]
                    loss.backward()
                opt.step(); opt.zero_grad()
        """,
    ),
    "GFY703-global-rebound-by-a-called-function": (
        "GFY703",
        """
        scale = 1.0
        temperature = 1.0
        def decay():
            global scale
            scale *= 0.5
        def cool():
            global temperature  # here
            temperature *= 0.9
        for epoch in range(4):
            decay()  # here
            for x, y in loader:
                cool()
                loss = criterion(model(x) / temperature, y) * scale
                loss.backward(); opt.step(); opt.zero_grad()
        def train():
            margin = 1.0
            def shrink():
                nonlocal margin
                margin *= 0.9
            for epoch in range(4):
                shrink()  # here
                for x, y in loader:
                    loss = criterion(model(x), y) + margin
                    loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        scale = 1.0
        best = 0.0
        def remember(value):
            global best
            best = max(best, value)
        for epoch in range(4):
            remember(epoch)
            for x, y in loader:
                loss = criterion(model(x), y) * scale
                loss.backward(); opt.step(); opt.zero_grad()
                remember(0.5)
        """,
    ),
    "GFY703-module-changed-by-apply-or-setattr": (
        "GFY703",
        """
        def set_dropout(m, p):
            if isinstance(m, nn.Dropout):
                m.p = p
        for epoch in range(4):
            model.apply(lambda m: set_dropout(m, 0.5 / (epoch + 1)))  # here
            for x, y in loader:
                setattr(criterion, "label_smoothing", 0.1)  # here
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
        """,
        """
        def init_weights(m):
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        model.apply(init_weights)
        setattr(criterion, "label_smoothing", 0.1)
        for epoch in range(4):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
        """,
    ),
    "GFY411-timm-step-update": (
        "GFY411",
        """
        sched = timm.scheduler.create_scheduler_v2(opt)
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            sched.step_update(num_updates=i)  # here
        """,
        """
        sched = timm.scheduler.create_scheduler_v2(opt)
        for epoch in range(10):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
        sched.step_update(num_updates=10)
        """,
    ),
}


def _all_cases() -> dict[str, tuple[str, str, str]]:
    cases = dict(CASES)
    for unit in graphify.rules.units():
        for name, (flagged, clean) in getattr(unit, "CASES", {}).items():
            cases[f"{unit.RULE.code}-{name}"] = (unit.RULE.code, flagged, clean)
    return cases


ALL_CASES = _all_cases()


def _lines_with(code: str, body: str) -> set[int]:
    source = _HEADER + textwrap.dedent(body)
    report = analyze_source(source, "case.py", Settings(select=["ALL"]))
    offset = len(_HEADER.splitlines()) + 1  # body line i (from 0) is source line offset + i
    return {line - offset for d in report.diagnostics if d.code == code for _, line in d.flagged()}  # where the flagged code stands


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_flagged(name):
    code, flagged, _ = ALL_CASES[name]
    marked = {i for i, line in enumerate(textwrap.dedent(flagged).splitlines()) if line.endswith("# here")}
    assert _lines_with(code, flagged) == marked


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_clean(name):
    code, _, clean = ALL_CASES[name]
    assert _lines_with(code, clean) == set()
