"""Running a script in the test's own process, as `python script.py` would run it: a fresh `__main__`
module, its standard output returned. A new python and torch cost about 3 s a script; the fast run
compares many originals with their rewrites this way. What the script changes in torch's global state
(the random generators, grad mode) is put back afterwards."""

from __future__ import annotations

import contextlib
import io
import runpy

import torch


def printed_by(path) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), torch.random.fork_rng(devices=[]), torch.set_grad_enabled(True):
        runpy.run_path(str(path), run_name="__main__")
    return out.getvalue()
