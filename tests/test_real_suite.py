"""The real-world suite's manifest and labels are well formed, and its scorer counts correctly."""

import importlib.util
import re
import sys
import tomllib
from pathlib import Path

from graphify.model import Verdict
from graphify.rules.registry import CATEGORIES

REAL = Path(__file__).resolve().parents[1] / "bench" / "real"


def _suite():
    """The manifest's entries and the GPU runs, from manifest.toml/runs.toml and each part in manifest.d/ and runs.d/."""
    sys.path.insert(0, str(REAL))
    from restore import load_manifest
    from run import load_runs

    return load_manifest(), *load_runs()


HELD_OUT = {"pytorch/examples", "pytorch/vision", "pytorch/tutorials", "tkipf/pygcn", "locuslab/tcn", "rtqichen/torchdiffeq"}
HELD_OUT |= {"yunjey/stargan", "schlumberger/joint-vae", "facebookresearch/dlrm", "ikostrikov/pytorch-flows", "microsoft/swin-transformer"}
HELD_OUT |= {"facebookresearch/convnext", "facebookresearch/simsiam", "facebookresearch/slowfast", "nvlabs/stylegan2-ada-pytorch"}
HELD_OUT |= {"jik876/hifi-gan", "openai/guided-diffusion", "lucidrains/vit-pytorch", "pyg-team/pytorch_geometric", "jingyaogong/minimind"}
HELD_OUT |= {"tatsu-lab/stanford_alpaca", "facebookresearch/dit", "openai/improved-diffusion", "leimao/pytorch-cuda-graph-capture-examples"}
HELD_OUT |= {"milesial/pytorch-unet", "ultralytics/yolov5", "jaxonwht/pytorch_toy"}


def _score_module():
    sys.path.insert(0, str(REAL))
    spec = importlib.util.spec_from_file_location("real_score", REAL / "score.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_score"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_manifest_pins_public_scripts():
    scripts = _suite()[0]
    assert len(scripts) >= 30 and len({s["repo"] for s in scripts}) >= 10
    assert len({s["id"] for s in scripts}) == len(scripts)
    for s in scripts:
        assert re.fullmatch(r"[0-9a-f]{40}", s["commit"]) and re.fullmatch(r"[0-9a-f]{40}", s["blob"]), s["id"]
        assert s["license"], s["id"]
        owner = s["repo"].split("/")[0].lower()
        assert owner not in ("karpathy", "bentrevett") and s["repo"].lower() not in HELD_OUT, "kept as an independent check"


def test_every_script_is_labelled_with_known_categories_and_verdicts():
    ids = {s["id"] for s in _suite()[0]}
    assert {p.stem for p in (REAL / "labels").glob("*.toml")} == ids
    verdicts = {v.value for v in Verdict} | {"already-captured"}
    for path in (REAL / "labels").glob("*.toml"):
        labels = tomllib.loads(path.read_text())
        assert path.read_text().startswith("# "), path.name
        for breaker in labels.get("breaker", []):
            assert breaker["category"] in CATEGORIES and breaker["line"] > 0, (path.name, breaker)
        for loop in labels.get("loop", []):
            assert loop["kind"] in ("train", "inference") and loop["verdict"] in verdicts, (path.name, loop)


def test_scorer_counts_hits_misses_false_alarms_and_ambiguous_labels():
    score = _score_module().score_file(
        {
            "breaker": [
                {"line": 3, "category": "host-sync"},
                {"line": 5, "category": "cross-device"},
                {"line": 9, "category": "logging-io", "ambiguous": True},
            ],
            "loop": [
                {"line": 2, "kind": "train", "verdict": "capturable-after-rewrite"},
                {"line": 20, "kind": "inference", "verdict": "capturable"},
            ],
        },
        diagnostics=[
            ((3,), "host-sync", "GFY001"),
            ((7,), "rng", "GFY601"),
            ((9,), "logging-io", "GFY511"),
            ((11, 40, 41), "rewrite-safety", "GFY703"),  # told at a call, flagging a helper's lines
        ],
        loops=[(2, "train", "not-capturable"), (30, "train", "capturable")],
    )
    assert (score.hits, score.labelled, score.reported, score.right) == (1, 2, 3, 1)
    assert score.missed == ["5: cross-device"]
    assert score.false_alarms == ["7: rng (GFY601)", "41: rewrite-safety (GFY703)"]  # one each, however many lines
    assert (score.loops_found, score.loops_labelled, score.loops_extra, score.verdicts_right) == (1, 2, 1, 0)


def test_every_script_has_a_gpu_run_or_says_why_not():
    scripts, runs, not_run = _suite()
    ids = [s["id"] for s in scripts]
    run_ids = [r["id"] for r in runs]
    assert len(run_ids) == len(set(run_ids)) and not set(run_ids) & set(not_run)
    assert sorted(run_ids + list(not_run)) == sorted(ids)
    from run import generators

    made = generators()  # bench/real/synth.py's and bench/real/shim/synth_extra.py's
    for run in runs:
        assert all(spec["make"] in made for spec in run.get("data", [])), run["id"]


def test_synthetic_data_has_the_formats_the_scripts_read(tmp_path):
    import pickle
    import struct

    sys.path.insert(0, str(REAL))
    import synth

    synth.mnist(tmp_path, train=30, test=10)
    images = (tmp_path / "MNIST/raw/train-images-idx3-ubyte").read_bytes()
    assert struct.unpack(">IIII", images[:16]) == (2051, 30, 28, 28) and len(images) == 16 + 30 * 784
    labels = (tmp_path / "MNIST/raw/t10k-labels-idx1-ubyte").read_bytes()
    assert struct.unpack(">II", labels[:8]) == (2049, 10) and max(labels[8:]) < 10
    synth.cifar10(tmp_path, train=50, test=20)
    with (tmp_path / "cifar-10-batches-py/data_batch_1").open("rb") as handle:
        batch = pickle.load(handle, encoding="latin1")
    assert batch["data"].shape == (10, 3072) and len(batch["labels"]) == 10
    synth.word_corpus(tmp_path / "train.txt", lines=5)
    assert len((tmp_path / "train.txt").read_text().splitlines()) == 5


def test_run_summary_counts_loops_refusals_and_verified_rewrites():
    sys.path.insert(0, str(REAL))
    from run_report import summary

    static = {
        "a": [
            {"kind": "train", "rewritten": True, "label": "capturable-after-rewrite", "codes": []},
            {"kind": "train", "rewritten": False, "label": "not-capturable", "codes": ["GFY701"]},
            {"kind": "inference", "rewritten": False, "label": "capturable-after-rewrite", "codes": ["GFY001"]},
        ]
    }
    passed = {"status": "passed", "speedup": 2.0, "runtime_notes": []}
    fell_back = {"status": "passed", "speedup": 1.1, "runtime_notes": ["x.py:3: GraphifyFallbackWarning: graphify: ..."]}
    records = [
        {
            "id": "a",
            "cuda_used": True,
            "verify": passed,
            "whole_run": {"eager": {"ok": True, "seconds": 3.0}, "graphify": {"ok": True, "seconds": 2.0}},
        },
        {
            "id": "b",
            "cuda_used": True,
            "verify": fell_back,
            "whole_run": {"eager": {"ok": True, "seconds": 3.0}, "graphify": {"ok": False, "why": "boom"}},
        },
    ]
    text = "\n".join(summary(records, static))
    assert "| training loops rewritten (of those found) | 1/2 (0 of them the model only) |" in text
    assert "| refusals true (hand label: not capturable whole) | 1/2 (1 disputed, 0 unlabelled) |" in text
    assert (
        "| rewrites verified equivalent on the GPU (teacher-forced) | 2/2 (1 ran eagerly: 1 after a failed capture, 0 with no gain expected) |"
        in text
    )
    assert "| rewritten scripts that crashed where eager ran | 1 |" in text
    assert "| step speedup (verify), median | 2.00× (min 2.00×) |" in text


def test_a_notebook_runs_as_the_script_of_its_code_cells(tmp_path):
    """run.py runs a notebook as its code cells joined in order, each line where graphify (and the labels)
    number it: IPython syntax is `pass` on its line, a non-timing cell magic blanks its cell, the rest is kept."""
    import json

    sys.path.insert(0, str(REAL))
    from run import _cells_refusal, notebook_script

    cells = [
        {"cell_type": "code", "source": ["%matplotlib inline\n", "import torch\n", "!pip install x"]},
        {"cell_type": "markdown", "source": ["# training"]},
        {"cell_type": "code", "source": ["%%bash\n", "ls\n"]},
        {"cell_type": "code", "source": "files = !ls\nx = torch.ones(2)\nx"},
    ]
    notebook = tmp_path / "nb.ipynb"
    notebook.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    script = notebook_script(notebook)
    assert script == tmp_path / "nb.py"
    assert script.read_text() == "pass\nimport torch\npass\n\n\nfiles = None\nx = torch.ones(2)\nx\n"
    assert _cells_refusal(notebook, script.read_text().replace("x = torch.ones(2)", "x = torch.zeros(2)")) is None
    refused = script.read_text().replace("torch\npass\n", "torch\nimport os\n")  # the shell escape's line changed
    assert _cells_refusal(notebook, refused) == "the rewrite would change IPython syntax in cell 1"


def test_the_time_split_table_sets_each_scripts_original_beside_its_rewrite():
    sys.path.insert(0, str(REAL))
    from run_report import time_split_table

    def split(step, data, pageable):
        seconds = {
            "startup": 9.0,
            "data_wait": data,
            "h2d_copies": pageable,
            "step": step,
            "host_reads": 0.0,
            "evaluation": 0.0,
            "rest": 0.0,
        }
        return {"seconds": seconds, "h2d_pageable_s": pageable}

    record = {
        "id": "demo",
        "verify": {
            "speedup": 2.0,
            "time_split": {"original": split(2.0, 1.0, 1.0), "rewrite": split(1.0, 1.0, 0.0)},
            "time_verdict": "launch-bound: 50% of the run after start-up is the step",
            "step_verdict": "host-bound: the GPU ran kernels only 20%",
        },
        "whole_run": {"eager": {"ok": True, "seconds": 13.0}, "graphify": {"ok": True, "seconds": 11.0}},
    }
    unsplit = {"id": "old", "verify": {"speedup": 1.5}}  # a record from before verify split the run: no row
    header, rule, row = time_split_table([record, unsplit])
    assert row == (
        "| demo | launch-bound | 4.00 s: data 25% copies 25% step 50% (pageable 25%) | 2.00 s: data 50% step 50% | 2.00× | 2.00× | 1.18× |"
    )


def test_the_long_run_table_gives_the_median_and_names_runs_slower_beyond_their_spread():
    sys.path.insert(0, str(REAL))
    from run_report import long_run_table

    def record(name, eager, graphed):
        runs = {"eager": {"ok": True, "seconds": eager[0], "runs": eager}, "graphify": {"ok": True, "seconds": graphed[0], "runs": graphed}}
        return {"id": name, "long": {"data": [{"make": "mnist", "at": "d", "train": 60000}]}, "whole_run": runs}

    faster, noisy, slower = (
        record("a", [30.0, 31.0], [20.0, 21.0]),
        record("b", [10.0, 12.0], [11.0, 11.5]),
        record("c", [10.0, 10.2], [12.0, 12.4]),
    )
    failed = {"id": "d", "long": {"args": ["--epochs", "1"]}, "whole_run": {"eager": {"ok": False, "why": "over 180 s"}, "graphify": {}}}
    lines = long_run_table([faster, noisy, slower, failed])
    assert lines[2] == "| a | train 60000 | 30.0/31.0 | 20.0/21.0 | 1.50× |  |"
    assert lines[3].endswith("| 0.91× | within the spread |")
    assert lines[5] == "| d | --epochs 1 | | | — | eager: over 180 s; graphify: ok |"
    assert lines[-1] == "median whole run 0.91× over 3 scripts (0.83× to 1.50×); slower than eager beyond the spread: c"


def test_data_made_from_another_spec_is_made_again(tmp_path, monkeypatch):
    sys.path.insert(0, str(REAL))
    import run

    monkeypatch.setattr(run, "WORK", tmp_path)
    images = tmp_path / "demo" / "d" / "MNIST" / "raw" / "train-images-idx3-ubyte"
    short = {"id": "demo", "data": [{"make": "mnist", "at": "d", "train": 100, "test": 10}]}
    run._make_data(short)
    assert images.stat().st_size == 16 + 100 * 28 * 28
    run._make_data(short, [{"make": "mnist", "at": "d", "train": 300, "test": 10}])
    assert images.stat().st_size == 16 + 300 * 28 * 28
    run._make_data(short)
    assert images.stat().st_size == 16 + 100 * 28 * 28
