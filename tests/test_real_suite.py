"""The real-world suite's manifest and labels are well formed, and its scorer counts correctly."""
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

from graphify.model import Verdict
from graphify.rules.registry import CATEGORIES

REAL = Path(__file__).resolve().parents[1] / "bench" / "real"


def _score_module():
    sys.path.insert(0, str(REAL))
    spec = importlib.util.spec_from_file_location("real_score", REAL / "score.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_score"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_manifest_pins_public_scripts():
    scripts = tomllib.loads((REAL / "manifest.toml").read_text())["script"]
    assert len(scripts) >= 30 and len({s["repo"] for s in scripts}) >= 10
    assert len({s["id"] for s in scripts}) == len(scripts)
    for s in scripts:
        assert re.fullmatch(r"[0-9a-f]{40}", s["commit"]) and re.fullmatch(r"[0-9a-f]{40}", s["blob"]), s["id"]
        assert s["license"], s["id"]
        owner = s["repo"].split("/")[0].lower()
        assert owner != "karpathy" and s["repo"].lower() != "pytorch/examples", "kept as an independent check"


def test_every_script_is_labelled_with_known_categories_and_verdicts():
    ids = {s["id"] for s in tomllib.loads((REAL / "manifest.toml").read_text())["script"]}
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
        {"breaker": [{"line": 3, "category": "host-sync"}, {"line": 5, "category": "cross-device"},
                     {"line": 9, "category": "logging-io", "ambiguous": True}],
         "loop": [{"line": 2, "kind": "train", "verdict": "capturable-after-rewrite"},
                  {"line": 20, "kind": "inference", "verdict": "capturable"}]},
        diagnostics=[(3, "host-sync", "GFY001"), (7, "rng", "GFY601"), (9, "logging-io", "GFY511")],
        loops=[(2, "train", "not-capturable"), (30, "train", "capturable")],
    )
    assert (score.hits, score.labelled, score.reported) == (1, 2, 2)
    assert score.missed == ["5: cross-device"] and score.false_alarms == ["7: rng (GFY601)"]
    assert (score.loops_found, score.loops_labelled, score.loops_extra, score.verdicts_right) == (1, 2, 1, 0)
