"""What the plan describes and the rewrite builds: a statement's captured and host halves (Plan.hoisted),
a keyed `if`'s captured chain and the chain run after the replay (Plan.split_ifs), and what the step reads
in place of a drawn expression (Plan.draws)."""

from __future__ import annotations

import libcst as cst

from graphify.analysis.names import code_text
from graphify.analysis.step_body import StepBody, is_mode_block
from graphify.plan.base import Hoist, Plan, branch_statements


class ReplaceNodes(cst.CSTTransformer):
    """Replaces nodes, by id, with new ones."""

    def __init__(self, replacements: dict[int, cst.BaseExpression]) -> None:
        self.replacements = replacements

    def on_leave(self, original, updated):
        return self.replacements.get(id(original), updated)


def regroup(body: StepBody, entries: list[tuple[int, cst.BaseStatement]]) -> list[cst.BaseStatement]:
    """Statements (index in `body`, statement) in output order, with neighbours opened from one mode block
    joined back into that block: what the planner leaves together reads as the source did."""
    out: list[cst.BaseStatement] = []
    last = None
    for index, stmt in entries:
        block = body.blocks[index]
        if block is not None and block is last and isinstance(stmt, cst.With):
            merged = [*out[-1].body.body, *stmt.body.body]
            out[-1] = out[-1].with_changes(body=out[-1].body.with_changes(body=merged))
            continue
        out.append(stmt)
        last = block if isinstance(stmt, cst.With) else None
    return out


def hoisted_halves(stmt: cst.BaseStatement, hoist: Hoist) -> tuple[cst.BaseStatement, cst.BaseStatement]:
    """(the captured half, the host half) of a statement of the source the plan splits: `total_tensor =
    model(x).sum()` and `total += total_tensor.item()`, each inside the mode blocks `stmt` stands in."""
    if is_mode_block(stmt) and len(stmt.body.body) == 1:
        captured, host = hoisted_halves(stmt.body.body[0], hoist)
        return _in_block(stmt, captured), _in_block(stmt, host).with_changes(leading_lines=[])
    captured = cst.parse_statement(f"{', '.join(hoist.names)} = {', '.join(code_text(e) for e in hoist.expressions)}")
    host = stmt.visit(ReplaceNodes({key: cst.Name(name) for key, name in hoist.replaced.items()}))
    return captured.with_changes(leading_lines=stmt.leading_lines), host.with_changes(leading_lines=[])


def _in_block(block: cst.With, stmt: cst.BaseStatement) -> cst.With:
    return block.with_changes(body=block.body.with_changes(body=[stmt]))


def split_if(stmt: cst.If, moved: list[set[int]]) -> tuple[cst.If, cst.If | None]:
    """A keyed `if` split in two: the chain with the statements the step keeps in each branch, and the
    chain with those that run after the replay (branches left empty at its end dropped; None if none)."""
    kept, after = [], []
    for b, branch in enumerate(branch_statements(stmt)):
        indexes = moved[b] if b < len(moved) else set()
        kept.append(regroup(branch, [(k, s) for k, s in enumerate(branch.statements) if k not in indexes]))
        after.append(regroup(branch, [(k, s) for k, s in enumerate(branch.statements) if k in indexes]))
    kept_used = max((b for b, branch in enumerate(kept) if branch), default=0)
    used = max((b for b, branch in enumerate(after) if branch), default=None)
    return _with_branches(stmt, kept[: kept_used + 1]), None if used is None else _with_branches(stmt, after[: used + 1])


def _with_branches(node: cst.If, branches: list[list[cst.BaseStatement]]) -> cst.If:
    """`node`'s chain with each branch's statements replaced, in order; branches past the list dropped."""
    body = node.body.with_changes(body=branches[0] or [cst.SimpleStatementLine([cst.Pass()])])
    rest = branches[1:]
    if not rest or node.orelse is None:
        return node.with_changes(body=body, orelse=None)
    if isinstance(node.orelse, cst.If):
        return node.with_changes(body=body, orelse=_with_branches(node.orelse, rest))
    block = node.orelse.body.with_changes(body=rest[0] or [cst.SimpleStatementLine([cst.Pass()])])
    return node.with_changes(body=body, orelse=node.orelse.with_changes(body=block))


def drawn_value(plan: Plan, key: int) -> cst.BaseExpression:
    """What the step reads in place of a drawn expression: its input, or the pass's item of it."""
    name = cst.Name(plan.draws[key][0])
    if key not in plan.draw_repeats:
        return name
    index = plan.draw_repeats[key][1]
    return cst.Subscript(name, [cst.SubscriptElement(cst.Index(cst.Name(index)))])
