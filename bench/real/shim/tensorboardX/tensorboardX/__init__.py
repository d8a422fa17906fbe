"""Put on PYTHONPATH by bench/real/run.py (`shims = ["tensorboardX"]`) for scripts that import tensorboardX,
which the GPU machine lacks: PyTorch's own SummaryWriter (the same API, the same event files) where the
tensorboard package is there, else a writer whose calls do nothing."""

try:
    from torch.utils.tensorboard import SummaryWriter
except ImportError:
    import os

    class SummaryWriter:
        def __init__(self, logdir=None, *args, log_dir=None, **kwargs):
            os.makedirs(log_dir or logdir or "runs", exist_ok=True)  # as tensorboardX does: scripts write beside the events

        def __getattr__(self, name):
            return lambda *args, **kwargs: None

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False


__all__ = ["SummaryWriter"]
