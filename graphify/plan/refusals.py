"""The planner's refusals: why a loop is not rewritten (Refusal), and the rules its own refusals name.

GFY701-706 are decided by the planner (dataflow.py, whole.py, inputs.py, mutations.py, partial.py); each
is a rule module of graphify/rules/rewrite_safety/ (its metadata, page and the advice the engine gives
with the refusal, RULE.fix.advice), which reports the per-step host values, host side effects and state
changes (GFY701-703) it finds by pattern too; the engine turns the planner's refusals into findings.
Partial capture refuses a DistributedDataParallel model with GFY613 (graphify/rules/distributed/). A
refusal may also name any rule whose finding the planner cannot leave eager (it comes with the finding).
"""

from __future__ import annotations

import libcst as cst

from graphify.model import Rule
from graphify.rules.distributed.gfy613_ddp_model_in_step import RULE as DDP_MODEL
from graphify.rules.rewrite_safety.gfy701_per_step_host_value import RULE as PER_STEP_HOST_VALUE
from graphify.rules.rewrite_safety.gfy702_host_side_effect_in_step import RULE as HOST_SIDE_EFFECT
from graphify.rules.rewrite_safety.gfy703_mutated_host_state import RULE as MUTATED_STATE
from graphify.rules.rewrite_safety.gfy704_order_dependent_host_statement import RULE as ORDER
from graphify.rules.rewrite_safety.gfy705_host_branch_with_else_in_step import RULE as HOST_BRANCH_IN_STEP
from graphify.rules.rewrite_safety.gfy706_unsupported_loop_shape import RULE as LOOP_SHAPE

__all__ = ["DDP_MODEL", "HOST_BRANCH_IN_STEP", "HOST_SIDE_EFFECT", "LOOP_SHAPE", "MUTATED_STATE", "ORDER", "PER_STEP_HOST_VALUE", "Refusal"]


class Refusal(Exception):
    """Why a loop is not rewritten: a rule code, a message, and where (None: the loop itself).
    `certain`: the code does what the rule says (False: the planner cannot tell, and refuses to be safe)."""

    def __init__(self, rule: Rule, message: str, node: cst.CSTNode | None = None, certain: bool = True) -> None:
        super().__init__(message)
        self.rule, self.node, self.certain = rule, node, certain

    @property
    def reason(self) -> str:
        return self.rule.code
