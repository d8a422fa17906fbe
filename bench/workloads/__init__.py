"""Benchmark workloads: plain eager PyTorch training scripts.

Each module in this package is a self-contained training script that exposes

* ``build(device) -> dict`` with ``model``, ``optimizer``, ``scheduler`` (or None), ``loss_fn`` and
  ``batches`` (8 pre-generated ``(x, y)`` pairs on ``device``), all from fixed seeds;
* ``train(model, optimizer, scheduler, loss_fn, batches, steps)``: an ordinary eager training loop
  (this is the code graphify rewrites);
* ``train_hand(model, optimizer, scheduler, loss_fn, batches, steps, warmup=3)``: the same training
  written by hand as a whole-step CUDA graph capture after ``warmup`` eager steps (needs CUDA).

The modules import nothing but torch so that a rewritten copy can be loaded from any directory.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

WORKLOADS_DIR = Path(__file__).resolve().parent

#: launch-bound workloads where CUDA graphs should help
SMALL_WORKLOADS = ("tiny", "mlp", "cnn", "transformer")
#: compute-bound workloads where CUDA graphs should not help
LARGE_WORKLOADS = ("mlp_large_batch", "cnn_large")
WORKLOADS = SMALL_WORKLOADS + LARGE_WORKLOADS


def workload_path(name: str) -> Path:
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS_DIR / f"{name}.py"


def load_module_from_path(path: str | Path, module_name: str) -> ModuleType:
    """Import a Python file as a module without needing its directory on sys.path."""
    spec = importlib.util.spec_from_file_location(module_name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    # registered so that code inspecting the module by name (torch.compile's guards) finds it
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def load_workload(name: str) -> ModuleType:
    return load_module_from_path(workload_path(name), f"bench_workload_{name}")
