"""mlp_large_batch: MLP 4096 wide, batch 8192, Adam. Compute-bound: CUDA graphs should not help."""

import warnings

import torch
from torch import nn


class CapturedStep:
    """Runs one training (or inference) step from a CUDA graph.

    For every distinct `key` (host-side branch outcomes such as "optimizer steps this time"), the first
    `warmup` calls on CUDA run eagerly on a side stream; the next call copies its inputs into static
    buffers, captures the step and replays it; later calls copy their inputs in and replay. A call whose
    inputs differ in shape, dtype or device from the captured ones, every call off CUDA (inputs, or for
    a step without tensor inputs the optimizers' parameters, not on CUDA), and
    a call after a float learning rate changed on an optimizer that cannot read a tensor one, run the
    step eagerly. With `device` set to a CUDA device, host tensors among the inputs are copied there
    first, so the step's own `.to(device)` calls find them in place. A replay returns the graph's
    static outputs, overwritten by the next replay.
    """

    def __init__(self, step, optimizers=(), device=None, warmup=3):
        self.step = step
        self.optimizers = optimizers
        self.device = torch.device(device) if device is not None else None
        self.warmup = warmup
        self.graphs = {}  # key -> (graph, static inputs, static outputs)
        self.eager_runs = {}  # key -> eager calls so far
        self.pool = None  # all graphs of this step share one memory pool
        self.stream = None
        self.lr_tensors = []  # [param group, device tensor, value it holds], refreshed when the float lr moves
        self.frozen_lrs = []  # (param group, lr at capture) for optimizers that read a float lr
        self.frozen_settings = []  # (param group, [(name, value at capture)]) for betas, momentum, weight decay

    def __call__(self, *inputs, key=()):
        if self.device is not None and self.device.type == "cuda":
            inputs = self._to_device(inputs, self.device)
        tensors = self._tensors(inputs)
        if not self._on_cuda(tensors):
            return self.step(*inputs)
        captured = self.graphs.get(key)
        if captured is not None:
            graph, static_tensors, static_outputs = captured
            if self._fits(static_tensors, tensors) and self._settings_unchanged():
                for static, new in zip(static_tensors, tensors):
                    static.copy_(new, non_blocking=True)
                for entry in self.lr_tensors:
                    group, lr, value = entry
                    if group["lr"] != value:  # the scheduler moved it: one small fill, outside the graph
                        lr.fill_(group["lr"])
                        entry[2] = group["lr"]
                graph.replay()
                return static_outputs
            return self.step(*inputs)
        if self.stream is None:
            self._make_optimizers_capturable()
            self.stream = torch.cuda.Stream()
        runs = self.eager_runs.get(key, 0)
        if runs < self.warmup:
            # Warmup steps are real steps on real batches, on a side stream as capture requires.
            self.eager_runs[key] = runs + 1
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                outputs = self.step(*inputs)
            torch.cuda.current_stream().wait_stream(self.stream)
            return outputs
        return self._capture_and_replay(key, inputs)

    def _capture_and_replay(self, key, inputs):
        static_inputs = self._clone(inputs)
        swapped = self._use_tensor_lrs()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                static_outputs = self.step(*static_inputs)
        finally:
            for group, lr in swapped:
                group["lr"] = lr
        self.pool = graph.pool()
        self.graphs[key] = (graph, self._tensors(static_inputs), static_outputs)
        graph.replay()  # capture records the step without running it: this replay trains on the batch
        return static_outputs

    def _on_cuda(self, tensors):
        """CUDA inputs; a step without tensor inputs (it reads buffers of its own) goes by its parameters."""
        if tensors:
            return all(t.is_cuda for t in tensors)
        params = [p for optimizer in self.optimizers for group in optimizer.param_groups for p in group["params"]]
        return bool(params) and all(p.is_cuda for p in params)

    def _settings_unchanged(self):
        return all(g["lr"] == lr for g, lr in self.frozen_lrs) and all(
            g[k] is v or g[k] == v for g, settings in self.frozen_settings for k, v in settings
        )

    def _make_optimizers_capturable(self):
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                if group.get("capturable") is False:
                    group["capturable"] = True
                    for p in group["params"]:
                        state = optimizer.state.get(p, {})
                        if torch.is_tensor(state.get("step")) and state["step"].device != p.device:
                            state["step"] = state["step"].to(p.device, torch.float32)

    def _use_tensor_lrs(self):
        """During capture, optimizers that support it read the learning rate from a device tensor."""
        swapped = []
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                if "capturable" in group and not torch.is_tensor(group["lr"]):
                    lr = torch.tensor(group["lr"], dtype=torch.float32, device=group["params"][0].device)
                    self.lr_tensors.append([group, lr, group["lr"]])
                    swapped.append((group, group["lr"]))
                    group["lr"] = lr
                elif not torch.is_tensor(group["lr"]):
                    self.frozen_lrs.append((group, group["lr"]))
                # schedulers may move these too (OneCycleLR cycles betas/momentum); the graph froze them
                self.frozen_settings.append((group, [(k, group[k]) for k in ("betas", "momentum", "weight_decay") if k in group]))
        return swapped

    @staticmethod
    def _tensors(value):
        if torch.is_tensor(value):
            return [value]
        if isinstance(value, (list, tuple)):
            return [t for v in value for t in CapturedStep._tensors(v)]
        if isinstance(value, dict):
            return [t for v in value.values() for t in CapturedStep._tensors(v)]
        return []

    @staticmethod
    def _fits(static, new):
        """Same shapes, dtypes and devices: the new inputs can be copied into the static buffers."""
        return len(static) == len(new) and all(
            s.shape == n.shape and s.dtype == n.dtype and s.device == n.device for s, n in zip(static, new)
        )

    @staticmethod
    def _to_device(value, device):
        if torch.is_tensor(value):
            return value.to(device, non_blocking=True)
        if isinstance(value, (list, tuple)):
            return type(value)(CapturedStep._to_device(v, device) for v in value)
        if isinstance(value, dict):
            return {k: CapturedStep._to_device(v, device) for k, v in value.items()}
        return value

    @staticmethod
    def _clone(value):
        if torch.is_tensor(value):
            return value.clone()
        if isinstance(value, (list, tuple)):
            return type(value)(CapturedStep._clone(v) for v in value)
        if isinstance(value, dict):
            return {k: CapturedStep._clone(v) for k, v in value.items()}
        return value


SEED = 0
NUM_BATCHES = 8
BATCH = 8192
IN_FEATURES = 1024
WIDTH = 4096
CLASSES = 1000


def build(device):
    device = torch.device(device)
    torch.manual_seed(SEED)
    # built and filled directly on the device: tens of millions of values are slow to make on the host
    with device:
        model = nn.Sequential(
            nn.Linear(IN_FEATURES, WIDTH),
            nn.ReLU(),
            nn.Linear(WIDTH, WIDTH),
            nn.ReLU(),
            nn.Linear(WIDTH, WIDTH),
            nn.ReLU(),
            nn.Linear(WIDTH, CLASSES),
        )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=device).manual_seed(SEED + 1)
    batches = [
        (
            torch.randn(BATCH, IN_FEATURES, generator=gen, device=device),
            torch.randint(0, CLASSES, (BATCH,), generator=gen, device=device),
        )
        for _ in range(NUM_BATCHES)
    ]
    return {
        "model": model,
        "optimizer": optimizer,
        "scheduler": None,
        "loss_fn": nn.CrossEntropyLoss(),
        "batches": batches,
    }


def train(model, optimizer, scheduler, loss_fn, batches, steps):
    model.train()

    # graphify: one training step of the loop below, replayed from a CUDA graph
    def train_step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    train_step = CapturedStep(train_step, optimizers=(optimizer,))
    for step in range(steps):
        x, y = batches[step % len(batches)]
        # graphify: replay the captured step (warmup and capture on first calls)
        train_step(x, y)
        if scheduler is not None:
            scheduler.step()


def train_hand(model, optimizer, scheduler, loss_fn, batches, steps):
    """Whole training step captured by hand in one CUDA graph; same updates as train()."""
    model.train()
    for group in optimizer.param_groups:
        if "capturable" in group:  # SGD has no step-count state and needs no flag
            group["capturable"] = True

    # 3 real training steps on a side stream (cuBLAS workspaces, optimizer state, allocator pools).
    warmup = min(3, steps)
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
