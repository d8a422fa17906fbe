"""The planner's refusals: why a loop is not rewritten (Refusal), and the rules its own refusals name.

GFY701-706 are decided by the planner (dataflow.py, whole.py, inputs.py, mutations.py, partial.py); the
rewrite-safety family (rules/rewrite_safety.py) registers them and reports the per-step host values, host
side effects and state changes (GFY701-703) it finds by pattern too, and the engine turns the planner's
refusals into findings with the fixes below. Partial capture refuses a DistributedDataParallel model with
GFY613, which the distributed family reports and registers. A refusal may also name any rule whose finding
the planner cannot leave eager (it comes with the finding).
"""

from __future__ import annotations

import libcst as cst

from graphify.model import Applicability, Fix, FixKind, Partial, Rule, Severity


def _rule(code: str, name: str, summary: str, rewritable: bool, fix: Fix) -> Rule:
    return Rule(code, name, "rewrite-safety", Severity.ERROR, summary, rewritable, fix)


PER_STEP_HOST_VALUE = _rule(
    "GFY701",
    "per-step-host-value",
    "the step reads a Python value that changes between steps; capture would freeze it",
    False,
    Fix(advice="keep the value on the device and update it in place before the step (`t.fill_(value)`), or make it constant for the loop"),
)
HOST_SIDE_EFFECT = _rule(
    "GFY702",
    "host-side-effect-in-step",
    "the step calls something with host side effects (`next`, `random`, numpy RNG, time, I/O); capture would run it once",
    True,  # only host draws that build the step's inputs: the rewrite draws them before each replay
    Fix(
        FixKind.FETCHED,
        Applicability.SAFE,
        advice="fetch batches and draw host random numbers before the step; draw random numbers on the device inside it",
    ),
)
MUTATED_STATE = _rule(
    "GFY703",
    "mutated-host-state",
    "an attribute or module mode the step depends on is changed in the loop or inside the step",
    False,
    Fix(partial=Partial.NEVER, advice="keep such state on the device, or constant for the loop; change modes outside the step"),
)
ORDER = _rule(
    "GFY704",
    "order-dependent-host-statement",
    "a host statement inside the step cannot move out of it without changing the order of effects",
    False,
    Fix(advice="put host work before the forward pass or after the optimizer step"),
)
HOST_BRANCH_IN_STEP = _rule(
    "GFY705",
    "host-branch-with-else-in-step",
    "a host `if` inside the step with an `elif`, on one line, with host statements in its `else`, or alone binding a value read after the step; one graph per outcome is not built for it",
    False,
    Fix(advice="write the branch as `if`/`else` whose branches only launch GPU work, or move it out of the step"),
)
LOOP_SHAPE = _rule(
    "GFY706",
    "unsupported-loop-shape",
    "the loop's shape is not one the rewrite handles (`else:` clause, step outside the loop body, GradScaler step before backward, a function defined in the loop)",
    False,
    Fix(advice="keep the step in the loop body (not in functions defined in the loop), and `else:` logic after the loop"),
)

DDP_MODEL = Rule(
    "GFY613",
    "ddp-model-in-step",
    "distributed",
    Severity.ERROR,
    "a DistributedDataParallel model needs side-stream construction and 11 warmup steps",
    True,
    Fix(FixKind.SIDE_STREAM, Applicability.GUARDED),
)


class Refusal(Exception):
    """Why a loop is not rewritten: a rule code, a message, and where (None: the loop itself).
    `certain`: the code does what the rule says (False: the planner cannot tell, and refuses to be safe)."""

    def __init__(self, rule: Rule, message: str, node: cst.CSTNode | None = None, certain: bool = True) -> None:
        super().__init__(message)
        self.rule, self.node, self.certain = rule, node, certain

    @property
    def reason(self) -> str:
        return self.rule.code
