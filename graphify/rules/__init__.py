"""Rule registry: every rule family is one module exposing RULES and a check(ctx) generator."""

from __future__ import annotations

from typing import Iterable

from graphify.model import Rule

from graphify.rules.registry import CATEGORIES, rule  # noqa: F401  (re-exported)


def families():
    # Imported lazily so that `graphify rules` and the reporters stay cheap to import.
    from graphify.rules import (
        allocation,
        amp,
        branches,
        devices,
        distributed,
        host_branch,
        host_sync,
        logging_io,
        optimizers,
        rewrite_safety,
        rng,
        shapes,
    )

    return (host_sync, branches, allocation, devices, shapes, optimizers, amp, host_branch, logging_io, rng, distributed, rewrite_safety)


def all_rules() -> list[Rule]:
    return sorted((r for fam in families() for r in fam.RULES), key=lambda r: r.code)


def rules_by_code() -> dict[str, Rule]:
    return {r.code: r for r in all_rules()}


def rule_doc(code: str) -> str:
    from importlib import resources  # with tempfile and shutil: only `graphify rule` reads the docs

    return resources.files("graphify.rules").joinpath("docs", f"{code}.md").read_text(encoding="utf-8")


def matches(r: Rule, selectors: Iterable[str]) -> bool:
    """A selector is a code, a code prefix (GFY0, GFY1...), a category name, or ALL."""
    for sel in selectors:
        sel = sel.strip()
        if sel.upper() == "ALL" or sel == r.category or (sel.upper().startswith("GFY") and r.code.startswith(sel.upper())):
            return True
    return False
