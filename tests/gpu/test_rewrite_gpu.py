"""On a GPU, graphify's rewrite of each benchmark workload trains like the eager loop and really replays."""

from __future__ import annotations

import importlib.util

import pytest
from harness import REPO, STEPS, train_workload  # first: it puts the repository on sys.path

from bench.workloads import SMALL_WORKLOADS, load_workload
from graphify.rewrite import rewrite_source
from graphify.runtime.common import WARMUP


def _rewritten(name, tmp_path):
    path = REPO / "bench" / "workloads" / f"{name}.py"
    result = rewrite_source(path.read_text(), str(path))
    assert [o.rewritten for o in result.outcomes if o.function == "train"] == [True]
    out = tmp_path / f"{name}_graphify.py"
    out.write_text(result.code)
    spec = importlib.util.spec_from_file_location(f"{name}_graphify", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _max_rel(a, b):
    return max(((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)).item() for k in b)


@pytest.mark.parametrize("name", SMALL_WORKLOADS)
def test_rewrite_matches_hand_capture_and_eager(name, tmp_path, always_capture, deterministic_cudnn, replays):
    # always_capture: every step after warmup replays, no trial turns
    module = load_workload(name)
    eager = train_workload(module)[0]
    eager_again = train_workload(module)[0]
    eager_capturable = train_workload(module, capturable=True)[0]
    hand = train_workload(module, "train_hand", warmup=WARMUP + 1)[0]  # as many eager steps as graphify's warmup
    rewritten_module = _rewritten(name, tmp_path)
    replays.clear()  # the hand capture's: only the rewrite's replays count below
    graphed = train_workload(rewritten_module)[0]
    report = {
        "eager vs eager": _max_rel(eager_again, eager),
        "graphify vs hand capture": _max_rel(graphed, hand),
        "graphify vs eager (capturable optimizer)": _max_rel(graphed, eager_capturable),
        "graphify vs eager": _max_rel(graphed, eager),
        "hand capture vs eager": _max_rel(hand, eager),
    }
    print(f"\n{name}: " + ", ".join(f"{k} {v:.2e}" for k, v in report.items()))
    # the warmup: WARMUP eager calls, one more for the host-value check (two recorded calls before the timed one);
    # the transformer's attention dropout hands its backward a seed made on the device, not a host value
    assert len(replays) == STEPS - WARMUP - 1, "every step after the warmup is a replay"
    assert report["graphify vs hand capture"] < 1e-5
    # eager and replayed kernels may round differently in the last bits; measured 1.1e-5 on the transformer
    assert report["graphify vs eager (capturable optimizer)"] < 1e-4
    # Plain eager uses the host-side optimizer arithmetic; the gap grows with steps (docs/verify.md).
    assert report["graphify vs eager"] < 5e-2
