"""Spellings of blocks that keep a step's meaning: bookkeeping written inside the step's mode block, and a loop
body written as the branch of a guard whose `else:` leaves the loop."""

from __future__ import annotations

import ast

from .registry import transformation
from .script import INDENT, Script, has_multiline_string, indented, script, step_loops

_MODES = ("no_grad", "enable_grad", "inference_mode", "autocast")


def _mode_block(loop: ast.For | ast.While) -> ast.With | None:
    """The first `with` of the loop's own body that only sets modes (`with torch.autocast(...):`)."""
    for stmt in loop.body:
        if isinstance(stmt, ast.With) and all(
            isinstance(item.context_expr, ast.Call)
            and item.optional_vars is None
            and (getattr(item.context_expr.func, "attr", None) or getattr(item.context_expr.func, "id", None)) in _MODES
            for item in stmt.items
        ):
            return stmt
    return None


def _assignment(stmts: list[ast.stmt], name: str) -> ast.Assign | None:
    return next(
        (st for st in stmts if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in st.targets)), None
    )


def _imports_torch(s: Script) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None for a in n.names) for n in s.tree.body)


@transformation
def bookkeeping_in_mode_block(source: str) -> str | None:
    """`history_.append(loss.item())` (a list nothing reads) goes in a mode block with the loss: at the end of the step's `with torch.autocast(...)` block binding it, or with the loss's statement in a new `with torch.enable_grad():` (grad is on in a step already)."""
    s = script(source)
    if "history_" in s.identifiers or "graphify: ignore" in s.source:
        return None
    edits = []
    for loop in step_loops(s):
        calls = [n for n in ast.walk(loop) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "backward"]
        if (
            not calls
            or not isinstance(calls[0].func.value, ast.Name)
            or not any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "item" for n in ast.walk(loop))
        ):
            continue  # only loops that read a value with `.item()` already: the loop's codes stay the same
        loss, block = calls[0].func.value.id, _mode_block(loop)
        line = _assignment(loop.body, loss)
        if block is not None and _assignment(block.body, loss) is not None and block.body[0].lineno != block.lineno:
            end = s.lines(block.lineno, block.end_lineno)[1]
            edits.append((end, end, f"{s.indent_of(block.body[0])}history_.append({loss}.item())\n"))
        elif line is not None and _imports_torch(s) and s.indent_of(line) and not has_multiline_string(s, line.lineno, line.end_lineno):
            ind = s.indent_of(line)
            start, end = s.lines(line.lineno, line.end_lineno)
            body = indented(s, line.lineno, line.end_lineno)
            edits.append((start, end, f"{ind}with torch.enable_grad():\n{body}{ind}{INDENT}history_.append({loss}.item())\n"))
        else:
            continue
        head = s.lines(loop.lineno, loop.lineno)[0]
        edits.append((head, head, f"{s.indent_of(loop)}history_ = []\n"))
    return s.edit(edits)


def _guardable(s: Script, loop: ast.For | ast.While) -> bool:
    """A loop that runs a whole step each iteration (its body steps an optimizer: not a micro-step loop inside
    a step, whose `break` graphify reads as control flow of the step), with no exit of its own."""
    return (
        any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "step" for st in loop.body for n in ast.walk(st))
        and not loop.orelse
        and loop.body[0].lineno != loop.lineno
        and not has_multiline_string(s, loop.body[0].lineno, loop.end_lineno)
        and not any(isinstance(n, (ast.Break, ast.Continue)) for st in loop.body for n in ast.walk(st))
    )


@transformation
def body_as_guarded_branch(source: str) -> str | None:
    """A training loop's body becomes `if steps_left_: <body> else: break` (`steps_left_ = True` set before the loop): a guard, as `if not steps_left_: break` is."""
    s = script(source)
    if "steps_left_" in s.identifiers:
        return None
    edits = []
    for loop in step_loops(s):
        if not _guardable(s, loop):
            continue
        ind, body_ind = s.indent_of(loop), s.indent_of(loop.body[0])
        first = loop.body[0].lineno
        start, end = s.lines(first, loop.end_lineno)
        body = indented(s, first, loop.end_lineno, INDENT)
        edits.append((start, end, f"{body_ind}if steps_left_:\n{body}{body_ind}else:\n{body_ind}{INDENT}break\n"))
        head = s.lines(loop.lineno, loop.lineno)[0]
        edits.append((head, head, f"{ind}steps_left_ = True\n"))
    return s.edit(edits)
