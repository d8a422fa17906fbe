"""The rule registry. A rule is one module, graphify/rules/<family>/gfyNNN_<name>.py, holding all of it:

* `RULE`: its metadata (code, name, category, severity, summary) and its fix descriptor (`RULE.fix`: what
  `graphify rewrite` does about its findings, and how safe that is), made with `rule(...)`;
* `detect(ck)`: a generator of its findings in one loop (absent for a rule only the planner decides);
* `CASES`: flagged and clean code, `{name: (flagged, clean)}`, the flagged code marking with `# here`
  each line reported (tests/test_rule_cases.py runs them);
* `DOC`: its one-screen page, printed by `graphify rule CODE` and published by `python -m graphify.docgen`.

Helpers a family's rules share stay in the family's `shared.py` (or in graphify/analysis/). A family not
yet split keeps one module exposing `RULES` and `check(ck)`, its docs in graphify/rules/docs/.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType
from typing import Callable, Iterable, Iterator

from graphify.model import Rule

from graphify.rules.registry import CATEGORIES, rule  # noqa: F401  (re-exported)

# Every rule, one line each (a family not yet split: one line for the family). The engine runs their
# detections in this order, which is the order of their findings.
REGISTRY = (
    "host_sync",
    "branches.gfy101_tensor_condition",
    "branches.gfy102_tensor_assert",
    "branches.gfy103_tensor_boolean_expression",
    "allocation.gfy201_tensor_from_host_data",
    "allocation.gfy202_factory_with_step_values",
    "devices",
    "shapes",
    "optimizers",
    "amp.gfy421_grad_scaler_step",
    "amp.gfy422_autocast_cache",
    "amp.gfy423_loss_scaler_helper",
    "host_branch.gfy501_gradient_accumulation_branch",
    "host_branch.gfy502_periodic_gpu_work",
    "logging_io.gfy511_host_logging_in_step",
    "logging_io.gfy512_file_io_in_step",
    "logging_io.gfy513_profiler_in_step",
    "rng.gfy601_rng_state_in_step",
    "rng.gfy602_custom_generator_in_step",
    "distributed.gfy611_collective_in_step",
    "distributed.gfy613_ddp_model_in_step",
    "distributed.gfy612_ddp_no_sync",
    "rewrite_safety.gfy702_host_side_effect_in_step",
    "rewrite_safety.gfy703_mutated_host_state",
    "rewrite_safety.gfy701_per_step_host_value",
    "rewrite_safety.gfy707_step_inside_opaque_helper",
    "rewrite_safety.gfy704_order_dependent_host_statement",  # decided by the planner: no detect
    "rewrite_safety.gfy705_host_branch_with_else_in_step",  # decided by the planner: no detect
    "rewrite_safety.gfy706_unsupported_loop_shape",  # decided by the planner: no detect
)


@cache
def units() -> tuple[ModuleType, ...]:
    # Imported lazily so that `graphify rules` and the reporters stay cheap to import.
    from importlib import import_module

    return tuple(import_module(f"graphify.rules.{name}") for name in REGISTRY)


def _rules_of(unit: ModuleType) -> tuple[Rule, ...]:
    return (unit.RULE,) if hasattr(unit, "RULE") else unit.RULES


def detectors() -> Iterator[Callable]:
    """Each rule's `detect(ck)` (a family's `check(ck)`), in the registry's order."""
    for unit in units():
        detect = getattr(unit, "detect", None) or getattr(unit, "check", None)
        if detect is not None:
            yield detect


def all_rules() -> list[Rule]:
    return sorted((r for unit in units() for r in _rules_of(unit)), key=lambda r: r.code)


def rules_by_code() -> dict[str, Rule]:
    return {r.code: r for r in all_rules()}


def unit_of(code: str) -> ModuleType | None:
    """The module of a rule split into its own (None for a rule of a family not yet split)."""
    return next((u for u in units() if hasattr(u, "RULE") and u.RULE.code == code), None)


def rule_doc(code: str) -> str:
    unit = unit_of(code)
    if unit is not None:
        return unit.DOC
    from importlib import resources  # with tempfile and shutil: only `graphify rule` reads the docs

    return resources.files("graphify.rules").joinpath("docs", f"{code}.md").read_text(encoding="utf-8")


def matches(r: Rule, selectors: Iterable[str]) -> bool:
    """A selector is a code, a code prefix (GFY0, GFY1...), a category name, or ALL."""
    for sel in selectors:
        sel = sel.strip()
        if sel.upper() == "ALL" or sel == r.category or (sel.upper().startswith("GFY") and r.code.startswith(sel.upper())):
            return True
    return False
