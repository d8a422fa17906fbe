"""Host bookkeeping that nothing reads, added after each training step: a meter, a history list, a print to stderr.

Each reads `loss.item()`, so it only goes into loops that already read a value with `.item()`, in files that
suppress no finding: the codes the loop's findings carry stay the same."""

from __future__ import annotations

import ast

from .registry import transformation
from .script import Script, after_imports, is_method_call, script, step_loops

_METER = '''

class AverageMeter_:
    """Running average of a logged value."""

    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, value, n=1):
        self.sum += value * n
        self.count += n


'''


def _loss_of(loop: ast.For | ast.While) -> str | None:
    """The name `.backward()` is called on in the loop, when a statement of the loop's own body (or of a `with`
    block in it) assigns it, so that it is bound at the end of every iteration."""
    calls = [n for n in ast.walk(loop) if is_method_call(n, "backward") and isinstance(n.func.value, ast.Name)]
    if not calls or not any(is_method_call(n, "item") for n in ast.walk(loop)):
        return None
    name = calls[0].func.value.id
    stmts = [st for top in loop.body for st in ([top, *top.body] if isinstance(top, ast.With) else [top])]
    assigned = any(isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in st.targets) for st in stmts)
    return name if assigned else None


def _after_each_step(s: Script, before: str, after: str, names: list[str], prelude: str = "", needs: tuple = ()) -> str | None:
    """`before` (formatted with the loop's indentation) goes before each training loop, `after` (formatted with the loss
    name) at the end of its body; `prelude` after the imports once."""
    if set(names) & s.identifiers or "graphify: ignore" in s.source:
        return None  # a suppressed `.item()` would not be among the loop's codes, the added one would
    edits = []
    for loop in step_loops(s):
        loss = _loss_of(loop)
        if loss is None or getattr(loop, "orelse", None) or loop.body[0].lineno == loop.lineno or not all(n(loop) for n in needs):
            continue
        ind, body_ind = s.indent_of(loop), s.indent_of(loop.body[0])
        start, end = s.lines(loop.lineno, loop.end_lineno)
        if before:
            edits.append((start, start, f"{ind}{before}\n"))
        edits.append((end, end, f"{body_ind}{after.format(loss=loss)}\n"))
    if edits and prelude:
        edits.append((after_imports(s), after_imports(s), prelude))
    return s.edit(edits)


@transformation
def add_meter(source: str) -> str | None:
    """An AverageMeter-style object gets `meter_.update(loss.item())` after each training step; nothing reads it."""
    return _after_each_step(script(source), "meter_ = AverageMeter_()", "meter_.update({loss}.item())", ["meter_", "AverageMeter_"], _METER)


@transformation
def add_history(source: str) -> str | None:
    """A list gets `history_.append(loss.item())` after each training step; nothing reads it."""
    return _after_each_step(script(source), "history_ = []", "history_.append({loss}.item())", ["history_"])


def _prints(loop: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print" for n in ast.walk(loop))


@transformation
def add_print_after_step(source: str) -> str | None:
    """Loops that already print get `print(loss.item(), file=sys.stderr)` after each training step."""
    s = script(source)
    has_sys = any(isinstance(a, ast.alias) and a.name == "sys" and a.asname is None for a in s.nodes)
    if not has_sys and "sys" in s.identifiers:
        return None
    out = _after_each_step(
        s, "", 'print("step loss", {loss}.item(), file=sys.stderr)', [], "" if has_sys else "import sys\n", needs=(_prints,)
    )
    return out


@transformation
def add_progress_bar(source: str) -> str | None:
    """Loops that already print get a progress bar (`status_`, a name that does not say so) showing each step's loss."""
    s = script(source)
    after = 'status_.set_description(f"loss {{{loss}.item():.4f}}")'
    return _after_each_step(
        s, "status_ = tqdm_(disable=True)", after, ["status_", "tqdm_"], "from tqdm import tqdm as tqdm_\n", needs=(_prints,)
    )
