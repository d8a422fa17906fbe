"""The rule registry. A rule is one module, graphify/rules/<family>/gfyNNN_<name>.py, holding all of it:

* `RULE`: its metadata (code, name, category, severity, summary) and its fix descriptor (`RULE.fix`: what
  `graphify rewrite` does about its findings, and how safe that is), made with `rule(...)`;
* `detect(ck)`: a generator of its findings in one loop (absent for a rule only the planner decides);
* `CASES`: flagged and clean code and the fix expected, `{name: (flagged, clean, removed)}`: the
  flagged code marks with `# here` each line reported, and `removed` says whether `graphify rewrite`
  removes those findings (tests/test_rule_cases.py runs them);
* `DOC`: its one-screen page, printed by `graphify rule CODE` and published by `python -m graphify.docgen`.

Helpers a family's rules share stay in the family's `shared.py` (or in graphify/analysis/). Nothing
outside a rule's module tests its code: the planner, the engine and verify read `RULE.fix` and
`RULE.category`. Adding a rule: write its module, and add its line to REGISTRY below.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType
from typing import Callable, Iterable

from graphify.model import Rule

from graphify.rules.registry import CATEGORIES, rule  # noqa: F401  (re-exported)

# Every rule, one line each, family by family. The engine runs their detections in this order; a family's
# findings come in the order its walk of the loop reached them (Finding.order; ties in this order).
REGISTRY = (
    # a call is read by one method read and one function read at most, tried in this order (host_sync/shared.py)
    "host_sync.gfy001_tensor_item",
    "host_sync.gfy002_tensor_tolist",
    "host_sync.gfy003_tensor_to_cpu",
    "host_sync.gfy004_tensor_numpy",
    "host_sync.gfy007_cuda_synchronize",
    "host_sync.gfy008_data_dependent_output_size",
    "host_sync.gfy005_tensor_to_python_scalar",
    "host_sync.gfy006_tensor_formatted",
    "host_sync.gfy010_clip_error_if_nonfinite",
    "host_sync.gfy011_empty_cache_in_step",
    "host_sync.gfy009_boolean_mask_indexing",
    "branches.gfy101_tensor_condition",
    "branches.gfy102_tensor_assert",
    "branches.gfy103_tensor_boolean_expression",
    "allocation.gfy201_tensor_from_host_data",
    "allocation.gfy202_factory_with_step_values",
    "devices.gfy303_host_array_index",
    "devices.gfy301_per_step_device_copy",
    "devices.gfy302_host_tensor_moved_in_step",
    "shapes.gfy253_graph_batch",
    "shapes.gfy254_tensor_grown_each_step",
    "shapes.gfy252_variable_length_batch",
    "shapes.gfy251_loader_without_drop_last",
    "optimizers.gfy401_optimizer_not_capturable",
    "optimizers.gfy402_optimizer_without_capture_support",
    "optimizers.gfy411_lr_scheduler_step",
    "optimizers.gfy412_lr_assignment",
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


def detectors() -> list[list[Callable]]:
    """Each family's rules' `detect(ck)`, family by family, in the registry's order (a rule only the planner
    decides has none). The engine puts the findings of one family in the order its walk of the loop reached
    them (Finding.order)."""
    families: dict[str, list[Callable]] = {}
    for name, unit in zip(REGISTRY, units()):
        detect = getattr(unit, "detect", None)
        if detect is not None:
            families.setdefault(name.split(".", 1)[0], []).append(detect)
    return list(families.values())


def all_rules() -> list[Rule]:
    return sorted((unit.RULE for unit in units()), key=lambda r: r.code)


def rules_by_code() -> dict[str, Rule]:
    return {r.code: r for r in all_rules()}


def unit_of(code: str) -> ModuleType | None:
    """The module of the rule with this code (None: no such rule)."""
    return next((u for u in units() if u.RULE.code == code), None)


def rule_doc(code: str) -> str:
    """The rule's page (its module's DOC); FileNotFoundError for an unknown code."""
    unit = unit_of(code)
    if unit is None:
        raise FileNotFoundError(f"no rule {code}")
    return unit.DOC


def matches(r: Rule, selectors: Iterable[str]) -> bool:
    """A selector is a code, a code prefix (GFY0, GFY1...), a category name, or ALL."""
    for sel in selectors:
        sel = sel.strip()
        if sel.upper() == "ALL" or sel == r.category or (sel.upper().startswith("GFY") and r.code.startswith(sel.upper())):
            return True
    return False
