'''The helper classes that `graphify rewrite` adds to a rewritten file, once each.

It is kept here as source text, because it becomes the user's code: plain PyTorch with no import of
graphify. Every golden rewrite runs it (`tests/test_rewrite_fixtures.py` on the CPU, `tests/test_rewrite_gpu.py` on CUDA).
'''

CLASS_NAME = "CapturedStep"

SOURCE = '''

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
'''

PARTIAL_CLASS_NAME = "GraphedModule"

PARTIAL_SOURCE = '''

class GraphedModule:
    """Runs a module's forward and backward from CUDA graphs (torch.cuda.make_graphed_callables) in a
    training step that cannot be captured whole: the loss, the optimizer and the scheduler stay eager.

    The first `warmup` calls on CUDA run the module eagerly on a side stream (capture needs the
    autograd nodes they create away from the default stream); the next one captures its forward and
    backward for that call's input shapes and replays them, as do later calls with the same shapes.
    Other shapes, dtypes or devices, eval mode, calls without grad and calls off CUDA run the module
    eagerly. The warmup passes that make_graphed_callables runs before capturing are undone (buffers
    such as batch-norm statistics and the CUDA RNG state are restored), so training sees each batch
    once. A replayed backward hands autograd the graph's own gradient buffers: reset gradients with
    `zero_grad(set_to_none=True)` (the default) before every backward.
    """

    def __init__(self, module, warmup=3):
        self.module = module
        self.warmup = warmup
        self.eager_runs = 0
        self.stream = None
        self.graphed = None  # the module's graphed forward and backward
        self.signature = None  # the inputs' shapes, dtypes, devices and requires_grad it was captured for

    def __call__(self, *inputs):
        if not self._graphable(inputs):
            return self.module(*inputs)
        signature = [(t.shape, t.dtype, t.device, t.requires_grad) for t in inputs]
        if self.graphed is None:
            if self.eager_runs < self.warmup:
                self.eager_runs += 1
                self.stream = self.stream or torch.cuda.Stream()
                self.stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.stream):
                    outputs = self.module(*inputs)
                torch.cuda.current_stream().wait_stream(self.stream)
                return outputs
            self._capture(inputs)
            self.signature = signature
        if signature != self.signature:
            return self.module(*inputs)
        return self.graphed(*inputs)

    def _graphable(self, inputs):
        return (
            self.module.training
            and torch.is_grad_enabled()
            and bool(inputs)
            and all(torch.is_tensor(t) and t.is_cuda for t in inputs)
            and not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in self.module.modules())
        )

    def _capture(self, inputs):
        buffers = [b.clone() for b in self.module.buffers()]
        rng = torch.cuda.get_rng_state()
        # make_graphed_callables swaps the forward of the module it is given: give it a holder
        holder = torch.nn.Module()
        holder.module = self.module
        holder.forward = self.module.__call__
        samples = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)
        self.graphed = torch.cuda.make_graphed_callables(holder, samples)
        with torch.no_grad():
            for buffer, saved in zip(self.module.buffers(), buffers):
                buffer.copy_(saved)
        torch.cuda.set_rng_state(rng)
'''
