"""The loop body as the step is planned from it, read statement by statement: a mode block (`with
torch.no_grad():`, `autocast(...)`) opened around each of its statements, and `if ok: ... else: break` read
as `if not (ok): break` followed by the branch. A normalized reading of the source that the planner's
checks walk as statements and the rewrite regroups into its output (rewrite/splits.regroup)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from graphify.analysis.names import dotted
from graphify.analysis.statements import exit_else


# context managers that only set modes for the code inside them: entered around each statement of
# their block in turn, the block computes the same
_MODE_CONTEXTS = frozenset({"no_grad", "enable_grad", "inference_mode", "autocast", "set_grad_enabled"})


@dataclass
class StepBody:
    """A loop body as the step planner reads it: a mode block (`with torch.no_grad():`) opened around each
    of its statements, so that host work inside it can leave the step like any other statement, and
    `if ok: ... else: break` read as `if not (ok): break` followed by the branch."""

    statements: list[cst.BaseStatement]
    origins: list[int]  # index in the loop body of the statement each one comes from
    blocks: list[cst.With | None]  # the mode block each one was opened from, in the tree it was read from


def step_statements(statements, guards: bool = True) -> StepBody:
    body = StepBody([], [], [])
    for origin, stmt in enumerate(statements):
        for opened, block in _opened(stmt, guards):
            body.statements.append(opened)
            body.origins.append(origin)
            body.blocks.append(block)
    return body


def _opened(stmt: cst.BaseStatement, guards: bool) -> list[tuple[cst.BaseStatement, cst.With | None]]:
    if is_mode_block(stmt):
        inner = stmt.body.body
        return [
            (stmt.with_changes(body=stmt.body.with_changes(body=[s]), leading_lines=stmt.leading_lines if k == 0 else []), stmt)
            for k, s in enumerate(inner)
        ]
    exit_branch = exit_else(stmt) if guards else None
    if exit_branch is not None:
        guard = cst.If(
            test=cst.UnaryOperation(operator=cst.Not(), expression=_parenthesized(stmt.test)),
            body=exit_branch,
            leading_lines=stmt.leading_lines,
        )
        return [(guard, None), *(opened for s in stmt.body.body for opened in _opened(s, guards))]
    return [(stmt, None)]


def is_mode_block(stmt: cst.CSTNode) -> bool:
    """`with torch.no_grad():`, `with torch.autocast("cuda", dtype=...):`, alone or together, no `as`."""
    if not isinstance(stmt, cst.With) or stmt.asynchronous is not None or not isinstance(stmt.body, cst.IndentedBlock):
        return False
    for item in stmt.items:
        func = item.item.func if isinstance(item.item, cst.Call) else None
        name = dotted(func) if func is not None else None
        if item.asname is not None or name is None or name.rsplit(".", 1)[-1] not in _MODE_CONTEXTS:
            return False
    return True


def _parenthesized(test: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or test.lpar:
        return test
    return test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
