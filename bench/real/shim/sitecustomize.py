"""Put on PYTHONPATH by bench/real/run.py for scripts that read CIFAR-10: torchvision checks the md5
sums of the dataset files, which synthetic data cannot match; accept files that exist."""

import os

try:
    import torchvision.datasets.cifar as _cifar
except Exception:  # no torchvision: nothing to adjust
    _cifar = None

if _cifar is not None:
    _cifar.check_integrity = lambda path, md5=None: os.path.isfile(path)
