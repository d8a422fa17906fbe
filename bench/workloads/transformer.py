"""transformer: 2-layer pre-norm transformer encoder language model (d_model 128, 4 heads,
sequence 64, batch 16, bias-free layers), AdamW with a cosine LR schedule stepped every step."""

import warnings

import torch
from torch import nn
from torch.nn import functional as F

SEED = 0
NUM_BATCHES = 8
BATCH = 16
SEQ = 64
VOCAB = 1000
D_MODEL = 128
HEADS = 4
FFN = 512
LAYERS = 2


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(1, SEQ, D_MODEL))
        # no biases (as in most current LMs): the key-projection bias of attention gets a gradient
        # that is pure rounding noise, which Adam scales up to full-size updates
        layer = nn.TransformerEncoderLayer(
            D_MODEL,
            HEADS,
            dim_feedforward=FFN,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
            bias=False,
        )
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos
        h = self.encoder(h)
        return self.head(self.norm(h))


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def build(device):
    device = torch.device(device)
    torch.manual_seed(SEED)
    model = TinyLM().to(device)
    nn.init.normal_(model.pos, std=0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000, eta_min=1e-5)
    gen = torch.Generator().manual_seed(SEED + 1)
    batches = []
    for _ in range(NUM_BATCHES):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
        batches.append((tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)))
    return {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "loss_fn": lm_loss,
        "batches": batches,
    }


def train(model, optimizer, scheduler, loss_fn, batches, steps):
    model.train()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def train_hand(model, optimizer, scheduler, loss_fn, batches, steps, warmup=3):
    """Whole training step captured by hand in one CUDA graph; same updates as train()."""
    model.train()
    for group in optimizer.param_groups:
        if "capturable" in group:  # SGD has no step-count state and needs no flag
            group["capturable"] = True

    # 3 real training steps on a side stream (cuBLAS workspaces, optimizer state, allocator pools).
    warmup = min(warmup, steps)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*capturable=True.*")
        for step in range(warmup):
            x, y = batches[step % len(batches)]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
    torch.cuda.current_stream().wait_stream(side)
    # drop the last warmup autograd graph: capture must build fresh AccumulateGrad nodes on its
    # own stream instead of reusing ones tied to the side stream
    loss = None
    if warmup == steps:
        return

    static_x = torch.empty_like(batches[0][0])
    static_y = torch.empty_like(batches[0][1])
    # Tensor LRs read by the graph; the scheduler keeps stepping the float LRs in param_groups and
    # the tensors are refreshed from them before each replay.
    float_lrs = [group["lr"] for group in optimizer.param_groups]
    lr_tensors = []
    if scheduler is not None:
        lr_tensors = [torch.tensor(float(lr), device=static_x.device) for lr in float_lrs]
        for group, lr_tensor in zip(optimizer.param_groups, lr_tensors):
            group["lr"] = lr_tensor

    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)  # grads are then allocated from the graph's pool
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        optimizer.step()
    for group, lr in zip(optimizer.param_groups, float_lrs):
        group["lr"] = lr

    for step in range(warmup, steps):
        x, y = batches[step % len(batches)]
        static_x.copy_(x)
        static_y.copy_(y)
        for group, lr_tensor in zip(optimizer.param_groups, lr_tensors):
            lr_tensor.fill_(group["lr"])
        graph.replay()
        if scheduler is not None:
            scheduler.step()
