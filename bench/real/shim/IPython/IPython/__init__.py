"""Put on PYTHONPATH by bench/real/run.py (`shims = ["IPython"]`) for notebooks run as scripts on the GPU machine, which
lacks IPython: the display helpers they import (IPython.display), which show nothing outside a notebook. matplotlib
asks an imported IPython for its version and its shell: a recent one, and none."""

version_info = (8, 30, 0, "")
__version__ = "8.30.0"


def get_ipython():  # no interactive shell: what matplotlib and tqdm ask before hooking into one
    return None
