"""Transformations: each takes a script's source and returns the transformed source, or None where it does not apply."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Transformation:
    name: str
    summary: str
    apply: Callable[[str], str | None]
    # codes the transformation trades one for the other by design (`float(loss)` is GFY005 where `loss.item()` is GFY001)
    same_codes: dict[str, str] = field(default_factory=dict)


TRANSFORMATIONS: list[Transformation] = []


def transformation(fn=None, *, same_codes: dict[str, str] | None = None):
    """Registers `fn` under its name, its docstring as the summary."""
    if fn is None:
        return lambda f: transformation(f, same_codes=same_codes)
    TRANSFORMATIONS.append(Transformation(fn.__name__, (fn.__doc__ or "").strip(), fn, same_codes or {}))
    return fn
