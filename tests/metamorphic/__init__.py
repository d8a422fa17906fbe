"""The metamorphic suite: source transformations that keep a script's meaning, and what graphify decides on a
script before and after each (tests/test_metamorphic.py, scripts/metamorphic-report)."""

from . import bookkeeping, loops, names, spelling, structure  # noqa: F401  (each registers its transformations)
from .registry import TRANSFORMATIONS, Transformation

__all__ = ["TRANSFORMATIONS", "Transformation"]
