"""Plans for rewriting loops: pure functions of the analysis, below the engine. A plan describes what the
rewrite does (indexes, the source's nodes, names, code); rewrite/ builds every node of the output.

`make_plan` returns the whole-step Plan of a loop or raises Refusal (with a rule code);
`make_partial_plan` the plan to graph only the model's forward and backward.
"""

from graphify.plan.base import FIXED_IN_PLACE, Plan, body_of
from graphify.plan.partial import PartialPlan, make_partial_plan
from graphify.plan.refusals import Refusal
from graphify.plan.whole import make_plan

__all__ = ["FIXED_IN_PLACE", "PartialPlan", "Plan", "Refusal", "body_of", "make_partial_plan", "make_plan"]
