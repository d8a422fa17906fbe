"""GFY253 graph-batch."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.statements import unguarded, walk
from graphify.model import Fix, Partial
from graphify.rules.registry import rule
from graphify.rules.shapes.shared import is_graph_loader, loaders

RULE = rule(
    "GFY253",
    "graph-batch",
    "dynamic-shape",
    "error",
    "a graph library's loader (PyG, DGL) batches graphs whose node and edge counts change every batch",
    False,
    Fix(partial=Partial.NEVER),
)


def _graph_batch(ck, call: cst.Call, loader_env, index: int):
    """The first statement of the loop body that reads the graph batch the loop's target holds, where the
    step takes its per-batch sizes from it."""
    loop = ck.loop.node
    if not isinstance(loop, cst.For) or not isinstance(loop.body, cst.IndentedBlock):
        return
    items = {n.value for n in walk(loop.target) if isinstance(n, cst.Name)}
    for stmt in unguarded(loop.body.body):
        read = next((n for n in walk(stmt) if isinstance(n, cst.Name) and n.value in items), None)
        if read is not None:
            yield ck.finding_at(
                RULE,
                read,
                ck.loop.module,
                f"`{read.value}` comes from `{code_of(call.func)}`, a graph library's loader: its batches' node and edge counts "
                "change with every batch, and the runtime tells its batch objects apart only by identity: no graph would replay",
                "leave this loop eager, or pad each batch to fixed node and edge counts and pass the padded tensors",
                order=(0, index, 0),
            )
            return


def detect(ck):
    for index, (call, loader_env) in enumerate(loaders(ck)):
        if is_graph_loader(call, loader_env):
            yield from _graph_batch(ck, call, loader_env, index)


CASES = {
    "dgl-blocks-through-enumerate": (
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
        False,
    ),
    "pyg-loader-in-a-helper-argument": (
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
        False,
    ),
}

DOC = """\
# GFY253 graph-batch

*Category: dynamic-shape · Severity: error · Removed by `graphify rewrite`: no*

## What it flags

A training or inference loop over the batches of a graph library's loader: PyTorch Geometric's
(`torch_geometric.loader.DataLoader`, `NeighborLoader`, ...) or DGL's (`dgl.dataloading.DataLoader`,
`GraphDataLoader`, ...), traced from the loop's iterable as for GFY251. Reported at the first statement of the
loop body that reads the batch (`x = blocks[0].srcdata["feat"]`, `batch = batch.to(device)`). Not flagged: a
full-graph loop that trains on one graph every step (no loader), and plain tensor loaders over graph data.

## Why it breaks capture

Each batch holds the graphs sampled into it: a PyG `Batch` or DGL blocks with as many node and edge rows as
those graphs have, which change with every batch, and a graph replays one set of shapes. The batch is also an
object, not a tensor: the runtime can only tell one batch from the next by identity, so every step would be a
new key and no graph would replay (the model graphed alone would be handed the object and stay eager).

## How to fix

Leave the loop eager; the launches of a GNN step are often a small part of its time next to the sampling.
Where the graphs have bounded sizes, pad each batch to fixed node and edge counts (with masked padding nodes
and self-loop padding edges), and hand the model the padded tensors instead of the batch object.

## Example

Flagged:
```python
from torch_geometric.loader import DataLoader

loader = DataLoader(dataset, batch_size=32, shuffle=True)
for batch in loader:
    batch = batch.to(device)
    loss = criterion(model(batch.x, batch.edge_index, batch.batch), batch.y)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead (graphs padded to `MAX_NODES` nodes and `MAX_EDGES` edges by the dataset):
```python
from torch.utils.data import DataLoader

loader = DataLoader(padded_dataset, batch_size=32, shuffle=True, drop_last=True)
for x, edge_index, node_mask, y in loader:
    x, edge_index, node_mask, y = x.to(device), edge_index.to(device), node_mask.to(device), y.to(device)
    loss = criterion(model(x, edge_index, node_mask), y)
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

Add `# graphify: ignore[GFY253]` to the flagged line.
"""
