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


@pytest.mark.parametrize("path", [p for p in PLANTED if header(p)["manifests"] == "cpu"], ids=lambda p: p.stem)
def test_planted_bug_fails_verify_on_cpu(path):
    original = ROOT / header(path)["planted"]
    report = verify_file(str(original), steps=100000, rewritten=str(path), profile=False, timeout=240)
    assert report.exit_code == 1, (report.message, report.detail)
    assert "NOT equivalent" in report.message
