"""`graphify verify` on a realistic script of fixtures/check. On a GPU, scripts/verify-fixtures (run by
scripts/gpu-check) verifies every rewritable fixture."""

import pytest
from fixture_cases import CHECK

from graphify.verify import verify_file


@pytest.mark.slow
def test_realistic_script_on_cpu():
    report = verify_file(str(CHECK / "mnist_main_function.py"), steps=10, args=["--epochs", "1"])
    assert report.passed, (report.message, report.detail)
    assert report.comparison.exact and report.comparison.steps == (10, 10)
