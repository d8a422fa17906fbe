from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run scripts/gpu-check on a GPU machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def settings():
    from graphify.config import Settings

    return Settings()


@pytest.fixture
def always_capture(monkeypatch):
    """Captures whatever the runtime's timings say (GRAPHIFY_CAPTURE=always): the CUDA tests compare replays
    with eager runs, where a step or model left eager as gaining nothing would compare eager with eager.
    Child processes (verify's) inherit it."""
    monkeypatch.setenv("GRAPHIFY_CAPTURE", "always")
