"""The same loops written differently: `while` over an iterator, `zip` with a counter, a counter by hand, and the
loop moved into a function or a method."""

from __future__ import annotations

import ast

from .registry import transformation
from .script import INDENT, Script, after_imports, dotted, has_multiline_string, indented, script, step_loops

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _header_lines(s: Script, loop: ast.For) -> tuple[int, int] | None:
    """The byte span of the loop's header lines, up to its first statement; None when the body shares its line."""
    if loop.body[0].lineno == loop.lineno or s.indent_of(loop) == "" and loop.col_offset:
        return None
    return s.lines(loop.lineno, loop.body[0].lineno - 1)


@transformation
def for_to_while_next(source: str) -> str | None:
    """A training `for x in it:` becomes `while True:` taking `x = next(iterator_)` until StopIteration."""
    s = script(source)
    taken = set(s.identifiers)
    edits = []
    for loop in step_loops(s):
        header = _header_lines(s, loop) if isinstance(loop, ast.For) and not loop.orelse else None
        if header is None:
            continue
        name = next(n for n in (f"iterator{i or ''}_" for i in range(100)) if n not in taken)
        taken.add(name)
        ind, unit = s.indent_of(loop), s.indent_of(loop.body[0])[len(s.indent_of(loop)) :]
        text = (
            f"{ind}{name} = iter({s.text(loop.iter)})\n{ind}while True:\n{ind}{unit}try:\n"
            f"{ind}{unit * 2}{s.text(loop.target)} = next({name})\n{ind}{unit}except StopIteration:\n{ind}{unit * 2}break\n"
        )
        edits.append((*header, text))
    return s.edit(edits)


def _enumerate_loops(s: Script) -> list[ast.For]:
    return [
        loop
        for loop in s.of(ast.For)
        if isinstance(loop.iter, ast.Call)
        and dotted(loop.iter.func) == "enumerate"
        and len(loop.iter.args) in (1, 2)
        and all(k.arg == "start" for k in loop.iter.keywords)
        and isinstance(loop.target, ast.Tuple)
        and len(loop.target.elts) == 2
    ]


def _start(s: Script, call: ast.Call) -> str:
    given = call.args[1:] or [k.value for k in call.keywords]
    return s.text(given[0]) if given else "0"


@transformation
def enumerate_to_zip_count(source: str) -> str | None:
    """`for i, x in enumerate(it, s)` becomes `for i, x in zip(itertools.count(s), it)`."""
    s = script(source)
    bound = any(isinstance(a, ast.alias) and a.name == "itertools" and a.asname is None for a in s.nodes)
    if not bound and "itertools" in s.identifiers:
        return None
    edits = []
    for loop in _enumerate_loops(s):
        start = _start(s, loop.iter)
        edits.append((*s.span(loop.iter), f"zip(itertools.count({'' if start == '0' else start}), {s.text(loop.iter.args[0])})"))
    if edits and not bound:
        edits.append((after_imports(s), after_imports(s), "import itertools\n"))
    return s.edit(edits)


def _continues(loop: ast.For) -> bool:
    """Whether a `continue` of this loop (not of a loop nested in it) is in its body."""
    stack = list(loop.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Continue):
            return True
        if not isinstance(node, (ast.For, ast.While, *_SCOPES)):
            stack.extend(ast.iter_child_nodes(node))
    return False


@transformation
def enumerate_to_counter(source: str) -> str | None:
    """`for i, x in enumerate(it):` becomes `i = 0` / `for x in it:` ... `i += 1`, where `i` is not used after the loop and nothing `continue`s."""
    s = script(source)
    edits = []
    for loop in _enumerate_loops(s):
        index = loop.target.elts[0]
        header = _header_lines(s, loop)
        if header is None or not isinstance(index, ast.Name) or loop.orelse or _continues(loop):
            continue
        uses = [n for n in s.of(ast.Name) if n.id == index.id]
        inside = {id(n) for n in ast.walk(loop)}
        if any(id(n) not in inside for n in uses) or any(isinstance(n.ctx, ast.Store) and n is not index for n in uses if id(n) in inside):
            continue
        ind, body_ind = s.indent_of(loop), s.indent_of(loop.body[0])
        text = f"{ind}{index.id} = {_start(s, loop.iter)}\n{ind}for {s.text(loop.target.elts[1])} in {s.text(loop.iter.args[0])}:\n"
        edits.append((*header, text))
        end = s.lines(loop.lineno, loop.end_lineno)[1]
        edits.append((end, end, f"{body_ind}{index.id} += 1\n"))
    return s.edit(edits)


def _bound_names(node: ast.AST) -> set[str]:
    """Names the statement binds in its own scope (not in functions, classes or comprehensions inside it)."""
    bound, stack = set(), [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            bound.add(n.id)
        elif isinstance(n, ast.alias):
            bound.add(n.asname or n.name.split(".")[0])
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
            continue
        if not isinstance(n, _SCOPES) or n is node:
            stack.extend(ast.iter_child_nodes(n))
    return bound


def _module_training_loop(s: Script) -> ast.stmt | None:
    """The first module-level loop that holds a training loop."""
    inner = step_loops(s)
    for stmt in s.tree.body:
        if isinstance(stmt, (ast.For, ast.While)) and any(loop is stmt or loop in ast.walk(stmt) for loop in inner):
            if s.indent_of(stmt) == "" and not stmt.col_offset and not has_multiline_string(s, stmt.lineno, stmt.end_lineno):
                return stmt
    return None


def _moved(s: Script, names: list[str], wrap) -> str | None:
    """The module-level training loop moved into the code `wrap(body, globals_line)` makes, names kept global
    where code outside the loop uses them."""
    loop = _module_training_loop(s)
    if loop is None or any(n in s.identifiers for n in names):
        return None
    inside = {id(n) for n in ast.walk(loop)}
    used_outside = {n.id for n in s.of(ast.Name) if id(n) not in inside}
    shared = sorted(_bound_names(loop) & used_outside)
    start, end = s.lines(loop.lineno, loop.end_lineno)
    return s.edit([(start, end, wrap(shared))])


@transformation
def loop_into_function(source: str) -> str | None:
    """A module-level training loop moves into `def train_loop_():` (declaring global what other code uses), called in its place."""
    s = script(source)

    def wrap(shared):
        declared = f"{INDENT}global {', '.join(shared)}\n" if shared else ""
        loop = _module_training_loop(s)
        return f"def train_loop_():\n{declared}{indented(s, loop.lineno, loop.end_lineno)}\n\ntrain_loop_()\n"

    return _moved(s, ["train_loop_"], wrap)


@transformation
def loop_into_method(source: str) -> str | None:
    """A module-level training loop moves into the method `run` of a class `Trainer_`, called in its place."""
    s = script(source)

    def wrap(shared):
        declared = f"{INDENT * 2}global {', '.join(shared)}\n" if shared else ""
        loop = _module_training_loop(s)
        body = indented(s, loop.lineno, loop.end_lineno, INDENT * 2)
        return f"class Trainer_:\n{INDENT}def run(self):\n{declared}{body}\n\nTrainer_().run()\n"

    return _moved(s, ["Trainer_", "run"], wrap)
