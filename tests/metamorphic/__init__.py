"""The metamorphic suite: source transformations that keep a script's meaning, and what graphify decides on a
script before and after each (tests/test_metamorphic.py, scripts/metamorphic-report)."""

# each module registers its transformations, in this order
from . import names, spelling, loops, structure, bookkeeping, blocks  # noqa: F401
from .registry import TRANSFORMATIONS, Transformation

__all__ = ["TRANSFORMATIONS", "Transformation"]
