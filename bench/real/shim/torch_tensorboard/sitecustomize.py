"""Put on PYTHONPATH by bench/real/run.py (`shims = ["torch_tensorboard"]`) for scripts that import
torch.utils.tensorboard where the tensorboard package is missing (the GPU machine lacks it; torch's module
raises ImportError then): that import gives a SummaryWriter whose calls do nothing. Where tensorboard is
installed, torch's own module loads as usual."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types


class _Writer:
    def __init__(self, log_dir=None, *args, **kwargs):
        os.makedirs(log_dir or "runs", exist_ok=True)  # as torch's writer does: scripts may write beside the events

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name != "torch.utils.tensorboard" or importlib.util.find_spec("tensorboard") is not None:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        module.SummaryWriter = module.FileWriter = _Writer


sys.meta_path.insert(0, _StandIn())
