"""rewrite-safety: why `graphify rewrite` leaves a loop alone when capture would change its training.

These rules are decided by the rewrite planner's dataflow rule (graphify/plan/dataflow.py), not by
a pattern of their own: `check` reports them where the planner refused a loop.
"""
from graphify.rules.registry import rule

PER_STEP_HOST_VALUE = rule("GFY701", "per-step-host-value", "rewrite-safety", "error", "the step reads a Python value that changes between steps; capture would freeze it", False)
HOST_SIDE_EFFECT = rule("GFY702", "host-side-effect-in-step", "rewrite-safety", "error", "the step calls something with host side effects (`next`, `random`, numpy RNG, time, I/O); capture would run it once", False)
MUTATED_STATE = rule("GFY703", "mutated-host-state", "rewrite-safety", "error", "an attribute or module mode the step depends on is changed in the loop or inside the step", False)
ORDER = rule("GFY704", "order-dependent-host-statement", "rewrite-safety", "error", "a host statement inside the step cannot move out of it without changing the order of effects", False)
HOST_BRANCH_IN_STEP = rule("GFY705", "host-branch-with-else-in-step", "rewrite-safety", "error", "a host `if` with an `else` (or on one line) inside the step; one graph per outcome is not built for it", False)
LOOP_SHAPE = rule("GFY706", "unsupported-loop-shape", "rewrite-safety", "error", "the loop's shape is not one the rewrite handles (`else:` clause, step outside the loop body, GradScaler step before backward)", False)

RULES = (PER_STEP_HOST_VALUE, HOST_SIDE_EFFECT, MUTATED_STATE, ORDER, HOST_BRANCH_IN_STEP, LOOP_SHAPE)

FIXES = {
    "GFY701": "keep the value on the device and update it in place before the step (`t.fill_(value)`), or make it constant for the loop",
    "GFY702": "fetch batches and draw host random numbers before the step; draw random numbers on the device inside it",
    "GFY703": "keep such state on the device, or constant for the loop; change modes outside the step",
    "GFY704": "put host work before the forward pass or after the optimizer step",
    "GFY705": "write the branch as `if` without `else`, or move it out of the step",
    "GFY706": "keep the step in the loop body, and `else:` logic after the loop",
}


def check(ck):
    """The planner decides these; there is nothing to find by pattern."""
    return iter(())
