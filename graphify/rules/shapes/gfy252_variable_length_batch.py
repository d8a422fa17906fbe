"""GFY252 variable-length-batch."""

import libcst as cst

from graphify.analysis.calls import local_function
from graphify.analysis.checker import code_of, is_true, kwarg
from graphify.analysis.names import dotted
from graphify.analysis.statements import walk
from graphify.model import Fix, Partial
from graphify.rules.registry import rule
from graphify.rules.shapes.shared import BUCKETING_LOADERS, loaders

RULE = rule(
    "GFY252",
    "variable-length-batch",
    "dynamic-shape",
    "error",
    "per-batch padding, packing or slicing to a per-step length changes shapes every step",
    False,
    Fix(partial=Partial.UNLESS_UNREAD),
)


_PADDING = {"pad_sequence", "pack_padded_sequence", "pack_sequence", "pad_packed_sequence"}
# Hugging Face collators that pad each batch to its longest sequence unless told `padding="max_length"`
_PADDING_COLLATORS = {"DataCollatorWithPadding", "DataCollatorForSeq2Seq", "DataCollatorForTokenClassification"}


def _pads_to_longest(call: cst.Call, aliases) -> bool:
    """`pad_sequence(...)`, or a call told `padding="longest"` / `padding=True` (`tokenizer.pad(...)`)."""
    if (aliases.qualify(call.func) or dotted(call.func) or "").rsplit(".", 1)[-1] in _PADDING:
        return True
    padding = kwarg(call, "padding")
    return padding is not None and (is_true(padding) or (isinstance(padding, cst.SimpleString) and padding.evaluated_value == "longest"))


def _padding_collate(ck, collate: cst.BaseExpression | None, env, order: tuple):
    """A DataLoader's `collate_fn` that pads each batch to its own longest sequence: a function of this
    file or of the function building the loader (by name, or through functools.partial) calling a padding
    function, or a padding collator."""
    module = env.module
    if isinstance(collate, cst.Call):
        name = module.aliases.qualify(collate.func) or dotted(collate.func) or ""
        if name.rsplit(".", 1)[-1] == "partial" and collate.args:
            collate = collate.args[0].value
        elif name.rsplit(".", 1)[-1] in _PADDING_COLLATORS:
            padding = kwarg(collate, "padding")
            if not (isinstance(padding, cst.SimpleString) and padding.evaluated_value == "max_length"):
                yield ck.finding_at(
                    RULE,
                    collate,
                    module,
                    f"`{code_of(collate)}` pads each batch to its longest sequence: every batch has its own shape",
                    'pad to a fixed length (`padding="max_length"`), or to a few bucket lengths, one graph each',
                    order=order,
                )
            return
    if not isinstance(collate, cst.Name):
        return
    defs = [n for n in walk(module.tree) if isinstance(n, cst.FunctionDef) and n.name.value == collate.value]
    local = local_function(collate.value, env) if env.func is not None else None
    if local is not None:
        defs = [local]
    if len(defs) != 1:
        return
    calls = [n for n in walk(defs[0]) if isinstance(n, cst.Call)]
    if any((module.aliases.qualify(c.func) or "") == "torch.nn.functional.pad" for c in calls):
        return  # padded on to a fixed width afterwards (`F.pad(x, (0, MAX_LEN - x.shape[1]))`)
    for node in calls:
        if _pads_to_longest(node, module.aliases):
            yield ck.finding_at(
                RULE,
                node,
                module,
                f"`{code_of(node)}` in the loader's collate function pads each batch to its longest sequence: every batch has its own shape",
                'pad to a fixed length (`padding="max_length"`), or to a few bucket lengths, one graph each',
                order=order,
            )


def detect(ck):
    for index, (call, loader_env) in enumerate(loaders(ck)):
        if loader_env.qualify(call.func) in BUCKETING_LOADERS:
            yield ck.finding_at(
                RULE,
                call,
                loader_env.module,
                f"`{code_of(call, 50)}` pads each batch to its longest sentence: every batch has its own shape",
                "give the fields a `fix_length`, or bucket to a few fixed lengths, one graph each",
                order=(0, index, 1),
            )
        else:
            yield from _padding_collate(ck, kwarg(call, "collate_fn"), loader_env, (0, index, 1))
    for call, site in ck.calls():
        last = (site.env.qualify(call.func) or "").rsplit(".", 1)[-1]
        if last in _PADDING:
            yield ck.finding(
                RULE,
                call,
                site,
                f"`{code_of(call)}` gives every batch its own shape",
                "pad to a fixed maximum length (or a few bucket lengths, one graph each)",
                order=(1, ck.position(call)),
            )


CASES = {
    "torchtext-bucket-iterator": (
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
        False,
    ),
    "collate-nested-in-loader-function": (
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
        False,
    ),
    "collate-pad-sequence": (
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
        False,
    ),
    "collate-tokenizer-pad": (
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
        False,
    ),
    "padding-collator": (
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
        False,
    ),
}

DOC = """\
# GFY252 variable-length-batch

*Category: dynamic-shape · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

Padding or packing of variable-length sequences inside the per-iteration region of a training or inference loop:
`pad_sequence(...)`, `pack_padded_sequence(...)`, `pack_sequence(...)` and `pad_packed_sequence(...)` from
`torch.nn.utils.rnn`. Also the `collate_fn` of the loop's DataLoader when it pads each batch to its longest
sequence: a function of the file or of the function building the loader (by name or through
`functools.partial`) calling one of those or a tokenizer with `padding=True` / `padding="longest"`, or a Hugging Face padding collator
(`DataCollatorWithPadding`, `DataCollatorForSeq2Seq`, `DataCollatorForTokenClassification`) without
`padding="max_length"`; and torchtext's `BucketIterator`, which pads each batch of similar lengths to its longest. Not flagged: fixed-length padding, and a collate function that pads on to a fixed width
with `F.pad` (as in the example below). Not detected, though they change shapes just the same: slicing to a per-step length (`x[:, :lengths.max()]`), and collate functions of a loader the analysis cannot trace.

## Why it breaks capture

Each batch is padded to its own longest sequence, so shapes change from step to step, and a graph replays one set
of shapes at fixed addresses: a longer batch does not fit the static buffers, a shorter one would leave stale data
in them. Every distinct shape would need its own graph and its own memory. Packing also computes its batch sizes on
the host from the lengths, a sync that capture forbids. Padding in the loop body that no model reads (CTC targets) lets the
models be graphed alone; the runtime leaves eager a model whose inputs take more than 8 shapes before one recurs.

## How to fix

Pad every batch to one fixed length (`padding="max_length"`), or to a few bucket lengths, and mask: attention masks
for the model, `ignore_index` for the labels, masked sums for custom losses. With buckets, capture one graph per
bucket sharing a memory pool (`torch.cuda.graph(g, pool=first.pool())`) and choose it from the batch's length
(`torch.compile(mode="reduce-overhead")` records one graph per distinct shape: it pays off only for a few shapes).

## Example

Flagged:
```python
for seqs, y in loader:               # seqs: a list of 1-D token tensors
    x = pad_sequence(seqs, batch_first=True, padding_value=PAD)
    loss = criterion(model(x, pad_mask=x == PAD), y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
def collate(batch):                  # runs in the loader workers, before the step
    seqs, ys = zip(*batch)
    x = pad_sequence([s[:MAX_LEN] for s in seqs], batch_first=True, padding_value=PAD)
    return F.pad(x, (0, MAX_LEN - x.shape[1]), value=PAD), torch.stack(ys)   # always MAX_LEN wide

loader = DataLoader(train_set, batch_size=32, collate_fn=collate, drop_last=True)
for x, y in loader:
    loss = criterion(model(x, pad_mask=x == PAD), y)
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY252]` to the flagged line.
"""
