"""The planted-bug suite (fixtures/planted/): wrong rewrites that `graphify verify --rewritten` must fail.

Each file is a rewrite of the script its `# planted:` line names, with one mistake a rewriter could make.
Bugs that show on the CPU (`# manifests: cpu`) are failed here; all of them on a GPU by scripts/gpu-check.
"""

import re
from pathlib import Path

import pytest

from graphify.verify import verify_file

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PLANTED = sorted((ROOT / "fixtures" / "planted").glob("*.py"))


def header(path: Path) -> dict:
    return dict(re.findall(r"^# (planted|manifests|bug): (.+)$", path.read_text(), flags=re.M))


def test_the_suite_covers_the_mistakes_a_rewriter_makes():
    assert len(PLANTED) >= 12
    for path in PLANTED:
        h = header(path)
        assert (ROOT / h["planted"]).exists() and h["manifests"] in ("cpu", "cuda") and h["bug"], path.name


def test_runtime_parts_a_plant_replaces_still_exist():
    """A plant that replaces a part of the runtime (a function, a method) plants nothing once that part is
    renamed: its rewrite would then run correctly and verify would pass it, on the GPU only."""
    import graphify.runtime.captured_step as captured_step

    for path in PLANTED:
        for owner, name in re.findall(r"^(planted_runtime|train_step)\.(\w+) = ", path.read_text(), flags=re.M):
            assert hasattr(captured_step if owner == "planted_runtime" else captured_step.CapturedStep, name), (path.name, name)


@pytest.mark.parametrize("path", [p for p in PLANTED if header(p)["manifests"] == "cpu"], ids=lambda p: p.stem)
def test_planted_bug_fails_verify_on_cpu(path):
    original = ROOT / header(path)["planted"]
    report = verify_file(str(original), steps=100000, rewritten=str(path), profile=False, timeout=240)
    assert report.exit_code == 1, (report.message, report.detail)
    assert "NOT equivalent" in report.message
