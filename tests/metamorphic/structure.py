"""The same program organised differently: a helper around the model call, a `__main__` guard, `model.train()`
in the caller or the callee, a dataclass config instead of argparse."""

from __future__ import annotations

import ast

from .names import _bound_to, _makes_model
from .registry import transformation
from .script import INDENT, Script, after_imports, first_code_line, has_multiline_string, indented, is_method_call, script

_FORWARD_HELPER = "\n\ndef forward_(module, *args, **kwargs):\n    return module(*args, **kwargs)\n\n\n"


@transformation
def extract_forward_helper(source: str) -> str | None:
    """Every call of a model variable, `model(x)`, becomes `forward_(model, x)` through a module-level helper."""
    s = script(source)
    if "forward_" in s.identifiers:
        return None
    models = set(_bound_to(s, _makes_model(s)))
    edits = []
    for call in s.of(ast.Call):
        if not (isinstance(call.func, ast.Name) and call.func.id in models):
            continue
        start, end = s.span(call.func)
        if s.data[end : end + 1] != b"(":
            continue
        opened = f"forward_({call.func.id}" + (", " if call.args or call.keywords else "")
        edits.append((start, end + 1, opened))
    if not edits:
        return None
    return s.edit([*edits, (after_imports(s), after_imports(s), _FORWARD_HELPER)])


def _is_main_guard(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


@transformation
def main_guard_wrap(source: str) -> str | None:
    """The module-level code after the last function or class moves under `if __name__ == "__main__":`."""
    s = script(source)
    body = s.tree.body[first_code_line(s) :]
    if not body or any(_is_main_guard(stmt) for stmt in body):
        return None
    last_def = max(
        (i for i, stmt in enumerate(body) if isinstance(stmt, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom))), default=-1
    )
    tail = body[last_def + 1 :]
    if not tail or not any(isinstance(n, (ast.For, ast.While)) for stmt in tail for n in ast.walk(stmt)):
        return None
    first, last = tail[0].lineno, tail[-1].end_lineno
    if has_multiline_string(s, first, last) or s.indent_of(tail[0]) != "" or tail[0].col_offset:
        return None
    return s.edit([(*s.lines(first, last), 'if __name__ == "__main__":\n' + indented(s, first, last))])


@transformation
def main_guard_unwrap(source: str) -> str | None:
    """The body of a module-level `if __name__ == "__main__":` runs unguarded."""
    s = script(source)
    guards = [stmt for stmt in s.tree.body if _is_main_guard(stmt) and not stmt.orelse]
    if len(guards) != 1 or guards[0].body[0].lineno == guards[0].lineno:
        return None
    guard = guards[0]
    unit = s.indent_of(guard.body[0])
    lines = s.data[slice(*s.lines(guard.body[0].lineno, guard.end_lineno))].decode().splitlines(keepends=True)
    if not unit or has_multiline_string(s, guard.lineno, guard.end_lineno) or any(ln.strip() and not ln.startswith(unit) for ln in lines):
        return None
    return s.edit([(*s.lines(guard.lineno, guard.end_lineno), "".join(ln.removeprefix(unit) for ln in lines))])


def _functions(s: Script) -> dict[str, ast.FunctionDef]:
    return {f.name: f for f in s.tree.body if isinstance(f, ast.FunctionDef)}


def _call_statements(s: Script, name: str) -> list[ast.Expr] | None:
    """The statements calling the module function `name`, when every call of it is one (positional arguments only)."""
    calls = [c for c in s.of(ast.Call) if isinstance(c.func, ast.Name) and c.func.id == name]
    stmts = [s.parent(c) for c in calls]
    if not calls or any(
        not isinstance(st, ast.Expr) or c.keywords or any(isinstance(a, ast.Starred) for a in c.args) for c, st in zip(calls, stmts)
    ):
        return None
    return stmts


def _body_start(fn: ast.FunctionDef) -> int:
    """Index of the first statement after the docstring."""
    first = fn.body[0]
    return 1 if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str) else 0


def _train_call(stmt: ast.stmt) -> str | None:
    """`m` for a statement `m.train()`."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if is_method_call(call, "train") and not call.args and not call.keywords and isinstance(call.func.value, ast.Name):
        return call.func.value.id
    return None


def _enclosing_function(s: Script, node: ast.AST) -> ast.AST:
    while (node := s.parent(node)) is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        pass
    return node if node is not None else s.tree


def _binds(scope: ast.AST, name: str) -> bool:
    params = scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs if isinstance(scope, ast.FunctionDef) else []
    return any(a.arg == name for a in params) or any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(scope)
    )


def _train_out(s: Script) -> str | None:
    """A function's leading `m.train()`, on a parameter or a global, before each statement calling the function."""
    edits = []
    for name, fn in _functions(s).items():
        start = _body_start(fn)
        if len(fn.body) <= start + 1 or (model := _train_call(fn.body[start])) is None or (stmts := _call_statements(s, name)) is None:
            continue
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if model in params:
            index = params.index(model)
            if any(len(st.value.args) <= index or not isinstance(st.value.args[index], ast.Name) for st in stmts):
                continue
            callers = [st.value.args[index].id for st in stmts]
        elif _binds(fn, model) or any(
            _binds(_enclosing_function(s, st), model) for st in stmts if _enclosing_function(s, st) is not s.tree
        ):
            continue
        else:
            callers = [model] * len(stmts)
        edits.append((*s.lines(fn.body[start].lineno, fn.body[start].end_lineno), ""))
        edits += [(s.lines(st.lineno, st.lineno)[0],) * 2 + (f"{s.indent_of(st)}{m}.train()\n",) for st, m in zip(stmts, callers)]
    return s.edit(edits)


def _preceding(s: Script, stmt: ast.stmt) -> ast.stmt | None:
    parent = s.parent(stmt)
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and stmt in block:
            i = block.index(stmt)
            return block[i - 1] if i else None
    return None


def _train_in(s: Script) -> str | None:
    """`m.train()` just before every call of a function taking `m` as the first statement of that function."""
    edits = []
    for name, fn in _functions(s).items():
        stmts = _call_statements(s, name)
        befores = [_preceding(s, st) for st in stmts or []]
        models = [_train_call(b) if b is not None else None for b in befores]
        if not stmts or None in models:
            continue
        positions = {
            next((i for i, a in enumerate(st.value.args) if isinstance(a, ast.Name) and a.id == m), None) for st, m in zip(stmts, models)
        }
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if len(positions) != 1 or None in positions or (position := positions.pop()) >= len(params):
            continue
        first = fn.body[_body_start(fn)] if len(fn.body) > _body_start(fn) else None
        if first is None or first.lineno == fn.lineno:
            continue
        edits += [(*s.lines(b.lineno, b.end_lineno), "") for b in befores]
        at = s.lines(first.lineno, first.lineno)[0]
        edits.append((at, at, f"{s.indent_of(first)}{params[position]}.train()\n"))
    return s.edit(edits)


@transformation
def move_model_train(source: str) -> str | None:
    """A function's leading `model.train()` moves to before each call of the function; where none leads, a `model.train()` just before every call moves in."""
    s = script(source)
    return _train_out(s) or _train_in(s)


_ARG_KEYWORDS = {"type", "default", "help", "metavar", "action", "choices", "dest"}


def _config_field(s: Script, call: ast.Call) -> str | None:
    """`name: type = default` for one `parser.add_argument("--name", ...)`, None for an argument a dataclass field cannot stand for."""
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    keywords = {k.arg: k.value for k in call.keywords}
    if len(flags) != len(call.args) or not any(f.startswith("--") for f in flags) or not set(keywords) <= _ARG_KEYWORDS:
        return None
    action = keywords.get("action")
    action = action.value if isinstance(action, ast.Constant) else action
    if action not in (None, "store_true", "store_false"):
        return None
    try:
        default = ast.literal_eval(keywords["default"]) if "default" in keywords else action == "store_false" if action else None
    except ValueError:
        return None
    if isinstance(default, (list, dict, set)) or (isinstance(default, str) and "type" in keywords):
        return None  # a mutable default, or one argparse would convert
    dest = keywords.get("dest")
    name = dest.value if isinstance(dest, ast.Constant) else next(f for f in flags if f.startswith("--"))[2:].replace("-", "_")
    kind = s.text(keywords["type"]) if isinstance(keywords.get("type"), ast.Name) else "bool" if action else type(default).__name__
    return f"{name}: {'object' if kind == 'NoneType' else kind} = {default!r}"


def _parser_statements(s: Script, block: list[ast.stmt]):
    """The parser's construction, its `add_argument` statements and the `args = parser.parse_args()` statement of one block."""
    for i, stmt in enumerate(block):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and s.text(stmt.value.func) == "argparse.ArgumentParser":
            if len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                parser = stmt.targets[0].id
                uses = [n for n in s.of(ast.Name) if n.id == parser]
                adds = [
                    st
                    for st in block[i + 1 :]
                    if isinstance(st, ast.Expr) and is_method_call(st.value, "add_argument") and s.text(st.value.func.value) == parser
                ]
                parse = [
                    st
                    for st in block[i + 1 :]
                    if isinstance(st, ast.Assign) and is_method_call(st.value, "parse_args") and s.text(st.value.func.value) == parser
                ]
                if len(parse) == 1 and len(uses) == 1 + len(adds) + 1 and not parse[0].value.args and not parse[0].value.keywords:
                    return stmt, adds, parse[0]
    return None


@transformation
def dataclass_config(source: str) -> str | None:
    """An argparse parser whose options all have defaults becomes a `@dataclass` `Config_`, and `args = Config_()` (the run without arguments)."""
    s = script(source)
    if {"Config_", "dataclass"} & s.identifiers:
        return None
    blocks = [s.tree.body] + [f.body for f in s.of(ast.FunctionDef)]
    found = next((p for p in (_parser_statements(s, b) for b in blocks) if p), None)
    if found is None:
        return None
    make, adds, parse = found
    fields = [_config_field(s, st.value) for st in adds]
    if not fields or None in fields:
        return None
    config = "from dataclasses import dataclass\n\n\n@dataclass\nclass Config_:\n" + "".join(f"{INDENT}{f}\n" for f in fields) + "\n\n"
    edits = [(*s.lines(st.lineno, st.end_lineno), "") for st in (make, *adds)]
    edits.append((*s.span(parse.value), "Config_()"))
    edits.append((after_imports(s), after_imports(s), config))
    return s.edit(edits)


@transformation
def add_annotations(source: str) -> str | None:
    """Assignments of a number or a string to a plain name get their type annotated (`lr: float = 0.1`)."""
    s = script(source)
    declared = {n for g in s.of(ast.Global, ast.Nonlocal) for n in g.names}
    edits = []
    for node in s.of(ast.Assign):
        value = node.value.operand if isinstance(node.value, ast.UnaryOp) else node.value
        target = node.targets[0]
        if len(node.targets) != 1 or not isinstance(target, ast.Name) or target.id in declared or isinstance(s.parent(node), ast.ClassDef):
            continue
        if isinstance(value, ast.Constant) and type(value.value) in (int, float, str, bool):
            edits.append((s.span(target)[1], s.span(target)[1], f": {type(value.value).__name__}"))
    return s.edit(edits)


@transformation
def add_docstrings_comments(source: str) -> str | None:
    """Functions without a docstring get one, and every `for` loop gets a comment line above it."""
    s = script(source)
    edits = []
    for fn in s.of(ast.FunctionDef):
        first = fn.body[0]
        if _body_start(fn) == 0 and first.lineno != fn.lineno and s.indent_of(first):
            at = s.lines(first.lineno, first.lineno)[0]
            edits.append((at, at, f'{s.indent_of(first)}"""Runs {fn.name}."""\n'))
    for loop in s.of(ast.For):
        if s.indent_of(loop) or not loop.col_offset:
            at = s.lines(loop.lineno, loop.lineno)[0]
            edits.append((at, at, f"{s.indent_of(loop)}# one pass over {s.text(loop.iter).splitlines()[0][:40]}\n"))
    return s.edit(sorted(set(edits)))


@transformation
def reorder_imports(source: str) -> str | None:
    """Each run of consecutive module-level import lines is put in reverse order."""
    s = script(source)
    edits, run = [], []
    for stmt in [*s.tree.body, None]:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) and not (isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"):
            if not run or stmt.lineno == run[-1].end_lineno + 1:
                run.append(stmt)
                continue
        if len(run) > 1:
            texts = [s.data[slice(*s.lines(st.lineno, st.end_lineno))].decode() for st in run]
            edits.append((s.lines(run[0].lineno, run[-1].end_lineno) + ("".join(reversed(texts)),)))
        run = [stmt] if isinstance(stmt, (ast.Import, ast.ImportFrom)) else []
    return s.edit(edits)
