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
