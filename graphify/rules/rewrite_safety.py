"""rewrite-safety: why `graphify rewrite` leaves a loop alone when capture would change its training.

GFY701-706 are decided by the rewrite planner's dataflow rule (graphify/plan/dataflow.py), not by
a pattern of their own: `check` reports every per-step host value, host side effect and mutated state
(GFY701-703) the planner finds, and the reason that decides a loop's verdict. GFY707 is a pattern:
the step handed to code the analysis cannot see.
"""

import libcst as cst

from graphify.analysis.calls import is_delegated_step
from graphify.analysis.checker import code_of
from graphify.analysis.vocabulary import SCALER
from graphify.rules.registry import rule

PER_STEP_HOST_VALUE = rule(
    "GFY701",
    "per-step-host-value",
    "rewrite-safety",
    "error",
    "the step reads a Python value that changes between steps; capture would freeze it",
    False,
)
HOST_SIDE_EFFECT = rule(
    "GFY702",
    "host-side-effect-in-step",
    "rewrite-safety",
    "error",
    "the step calls something with host side effects (`next`, `random`, numpy RNG, time, I/O); capture would run it once",
    False,
)
MUTATED_STATE = rule(
    "GFY703",
    "mutated-host-state",
    "rewrite-safety",
    "error",
    "an attribute or module mode the step depends on is changed in the loop or inside the step",
    False,
)
ORDER = rule(
    "GFY704",
    "order-dependent-host-statement",
    "rewrite-safety",
    "error",
    "a host statement inside the step cannot move out of it without changing the order of effects",
    False,
)
HOST_BRANCH_IN_STEP = rule(
    "GFY705",
    "host-branch-with-else-in-step",
    "rewrite-safety",
    "error",
    "a host `if` with an `else` (or on one line) inside the step; one graph per outcome is not built for it",
    False,
)
LOOP_SHAPE = rule(
    "GFY706",
    "unsupported-loop-shape",
    "rewrite-safety",
    "error",
    "the loop's shape is not one the rewrite handles (`else:` clause, step outside the loop body, GradScaler step before backward, a function defined in the loop)",
    False,
)

OPAQUE_STEP = rule(
    "GFY707",
    "step-inside-opaque-helper",
    "rewrite-safety",
    "error",
    "the loss and the optimizer are handed to a callable defined elsewhere, which runs the step out of sight",
    False,
)

RULES = (PER_STEP_HOST_VALUE, HOST_SIDE_EFFECT, MUTATED_STATE, ORDER, HOST_BRANCH_IN_STEP, LOOP_SHAPE, OPAQUE_STEP)

FIXES = {
    "GFY701": "keep the value on the device and update it in place before the step (`t.fill_(value)`), or make it constant for the loop",
    "GFY702": "fetch batches and draw host random numbers before the step; draw random numbers on the device inside it",
    "GFY703": "keep such state on the device, or constant for the loop; change modes outside the step",
    "GFY704": "put host work before the forward pass or after the optimizer step",
    "GFY705": "write the branch as `if` without `else`, or move it out of the step",
    "GFY706": "keep the step in the loop body (not in functions defined in the loop), and `else:` logic after the loop",
}


def check(ck):
    for node, site in ck.nodes():
        if isinstance(node, cst.Call) and is_delegated_step(node, site.env) and site.env.kind_of(node.func) != SCALER:
            yield ck.finding(
                OPAQUE_STEP,
                node,
                site,
                f"`{code_of(node.func)}(...)` is handed the loss and the optimizer; what it runs is not visible",
                "call `loss.backward()` and `optimizer.step()` in the loop, or in a function of the checked files",
            )
