"""The fixtures are the contract: every expected diagnostic and loop verdict, and nothing else."""

from pathlib import Path

import pytest
from fixture_cases import cases, expectations

from graphify.engine import analyze_source
from graphify.files import discover, read_source


def _check(case: Path, settings):
    files, errors = discover([str(case)], settings)
    assert not errors
    found_diags, found_loops = set(), set()
    for path in files:
        report = analyze_source(read_source(path), path, settings)
        assert not report.errors, report.errors
        found_diags |= {(Path(p).name, line, d.code) for d in report.diagnostics for p, line in d.flagged()}
        found_loops |= {(Path(lp.path).name, lp.line, lp.kind, lp.verdict.value) for lp in report.loops}
    return found_diags, found_loops


@pytest.mark.parametrize("case", cases(), ids=lambda p: p.name)
def test_fixture_diagnostics(case, settings):
    expected_diags, expected_loops = expectations(case)
    found_diags, found_loops = _check(case, settings)
    assert sorted(found_diags - expected_diags) == [], "unexpected diagnostics"
    assert sorted(expected_diags - found_diags) == [], "missed diagnostics"
    assert sorted(found_loops ^ expected_loops) == [], f"loops differ: expected {sorted(expected_loops)}"


def test_corpus_is_large_and_varied():
    all_cases = cases()
    assert len(all_cases) >= 25
    verdicts = {v for c in all_cases for *_, v in expectations(c)[1]}
    assert verdicts == {"capturable", "capturable-after-rewrite", "partially-capturable", "not-capturable", "already-captured"}


def test_recursive_helpers_do_not_exhaust_the_stack(tmp_path, settings):
    """Helpers that call themselves (directly or in turn) once sent the value inference into a
    RecursionError on real files of the torch package."""
    source = (
        "import torch\n"
        "def walk(x):\n    y = other(x)\n    return y\n"
        "def other(x):\n    z = walk(x)\n    return z\n"
        "def train(model, opt, loader):\n"
        "    for x in loader:\n"
        "        y = walk(model(x))\n"
        "        y.sum().backward()\n"
        "        opt.step()\n"
    )
    report = analyze_source(source, "recursive.py", settings)
    assert not report.errors
    assert [lp.kind for lp in report.loops] == ["train"]
