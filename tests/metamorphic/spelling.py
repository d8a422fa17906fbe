"""Other spellings of the same code: imports, device tests, calls with their default spelled out, conditions."""

from __future__ import annotations

import ast

from .registry import transformation
from .script import Script, dotted, has_multiline_string, indented, is_method_call, script


def _torch_imported(s: Script) -> bool:
    return any(isinstance(a, ast.alias) and a.name == "torch" and a.asname is None for a in s.nodes)


@transformation
def import_torch_as_th(source: str) -> str | None:
    """`import torch` becomes `import torch as th`, and every use of `torch` reads `th`."""
    s = script(source)
    if not _torch_imported(s) or "th" in s.identifiers:
        return None
    edits = [(*s.span(a), "torch as th") for a in s.of(ast.alias) if a.name == "torch" and a.asname is None]
    uses = [s.span(n) for n in s.of(ast.Name) if n.id == "torch"]
    if any(s.data[a:b] != b"torch" for a, b in uses):
        return None
    return s.edit(edits + [(a, b, "th") for a, b in uses])


@transformation
def from_torch_import(source: str) -> str | None:
    """`import torch.nn as nn` becomes `from torch import nn` (the same for optim), and `torch.nn.X`, `torch.optim.X` read `nn.X`, `optim.X`."""
    s = script(source)
    if not _torch_imported(s):
        return None
    edits, added = [], []
    for sub in ("nn", "optim"):
        binders = [a for a in s.of(ast.alias) if (a.asname or a.name.split(".")[0]) == sub]
        if any(a.name != f"torch.{sub}" and not _from_torch(s, a, sub) for a in binders):
            continue  # `nn` or `optim` is something else here
        chains = [n for n in s.of(ast.Attribute) if isinstance(n.value, ast.Name) and n.value.id == "torch" and n.attr == sub]
        if chains and not binders:
            if any(n.id == sub for n in s.of(ast.Name)):
                continue  # a variable of that name
            added.append(sub)
        for imp in s.of(ast.Import):
            if [a.name for a in imp.names] == [f"torch.{sub}"] and imp.names[0].asname == sub:
                edits.append((*s.span(imp), f"from torch import {sub}"))
        edits += [(*s.span(n), sub) for n in chains]
    if added:
        first = next(a for a in s.of(ast.Import) if any(x.name == "torch" and x.asname is None for x in a.names))
        edits.append((*[s.span(first)[1]] * 2, "".join(f"\nfrom torch import {sub}" for sub in added)))
    return s.edit(edits)


def _from_torch(s: Script, alias: ast.alias, sub: str) -> bool:
    parent = s.parent(alias)
    return isinstance(parent, ast.ImportFrom) and parent.module == "torch" and alias.name == sub and alias.asname is None


def _device_names(s: Script) -> set[str]:
    return {
        t.id
        for a in s.of(ast.Assign)
        if isinstance(a.value, ast.Call) and (dotted(a.value.func) or "").endswith(".device")
        for t in a.targets
        if isinstance(t, ast.Name)
    }


@transformation
def cuda_test_respelled(source: str) -> str | None:
    """`x.is_cuda` becomes `x.device.type == "cuda"`, and `device.type == "cuda"` (a `torch.device`) becomes `str(device).startswith("cuda")`."""
    s = script(source)
    devices = _device_names(s)
    edits = [(*s.span(n), f'({s.text(n.value)}.device.type == "cuda")') for n in s.of(ast.Attribute) if n.attr == "is_cuda"]
    for cmp in s.of(ast.Compare):
        left, (op,), (right,) = cmp.left, cmp.ops, cmp.comparators
        if isinstance(op, ast.Eq) and isinstance(right, ast.Constant) and right.value == "cuda" and isinstance(left, ast.Attribute):
            if left.attr == "type" and isinstance(left.value, ast.Name) and left.value.id in devices:
                edits.append((*s.span(cmp), f'str({left.value.id}).startswith("cuda")'))
    return s.edit(edits)


@transformation
def is_available_respelled(source: str) -> str | None:
    """`torch.cuda.is_available()` becomes `torch.cuda.device_count() > 0`."""
    s = script(source)
    calls = [c for c in s.of(ast.Call) if dotted(c.func) == "torch.cuda.is_available" and not c.args and not c.keywords]
    return s.edit([(*s.span(c), "(torch.cuda.device_count() > 0)") for c in calls])


def _losses(s: Script) -> set[str]:
    return {c.func.value.id for c in s.of(ast.Call) if is_method_call(c, "backward") and isinstance(c.func.value, ast.Name)}


@transformation(same_codes={"GFY005": "GFY001"})
def item_as_float(source: str) -> str | None:
    """`loss.item()` becomes `float(loss)` for the variables a backward pass runs from (floating-point scalars)."""
    s = script(source)
    if "graphify: ignore" in source:
        return None  # a suppressed GFY001 would come back as an unsuppressed GFY005
    losses = _losses(s)
    calls = [
        c
        for c in s.of(ast.Call)
        if is_method_call(c, "item") and not c.args and isinstance(c.func.value, ast.Name) and c.func.value.id in losses
    ]
    return s.edit([(*s.span(c), f"float({c.func.value.id})") for c in calls])


@transformation
def to_device_keyword(source: str) -> str | None:
    """`x.to(device)` becomes `x.to(device=device)` where `device` holds a `torch.device`."""
    s = script(source)
    devices = _device_names(s)
    calls = [
        c
        for c in s.of(ast.Call)
        if is_method_call(c, "to") and len(c.args) == 1 and isinstance(c.args[0], ast.Name) and c.args[0].id in devices
    ]
    return s.edit([(*s.span(c.args[0]), f"device={c.args[0].id}") for c in calls])


@transformation
def zero_grad_explicit_default(source: str) -> str | None:
    """`zero_grad()` becomes `zero_grad(set_to_none=True)`, its default spelled out."""
    s = script(source)
    calls = [c for c in s.of(ast.Call) if is_method_call(c, "zero_grad") and not c.args and not c.keywords]
    return s.edit(
        [(s.span(c)[1] - 1, s.span(c)[1] - 1, "set_to_none=True") for c in calls if s.data[s.span(c)[1] - 2 : s.span(c)[1]] == b"()"]
    )


_FLIPPED = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: ">", ast.Gt: "<", ast.LtE: ">=", ast.GtE: "<="}


def _pure(node: ast.AST) -> bool:
    """Evaluating it calls nothing, so that two such operands may be evaluated in either order."""
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return _pure(node.value)
    if isinstance(node, ast.BinOp):
        return _pure(node.left) and _pure(node.right)
    if isinstance(node, ast.UnaryOp):
        return _pure(node.operand)
    return False


@transformation
def flip_comparisons(source: str) -> str | None:
    """`a < b` becomes `b > a` (and so on) where both sides are names, attributes, constants or arithmetic on them."""
    s = script(source)
    edits = []
    for cmp in s.of(ast.Compare):
        (op,), (right,) = cmp.ops, cmp.comparators
        if type(op) in _FLIPPED and _pure(cmp.left) and _pure(right) and "\n" not in s.text(cmp):
            edits.append((s.span(cmp.left)[0], s.span(right)[1], f"{s.text(right)} {_FLIPPED[type(op)]} {s.text(cmp.left)}"))
    return s.edit(edits)


def _operand(s: Script, node: ast.AST) -> str:
    text = s.text(node)
    low = isinstance(node, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)) or "\n" in text
    return f"({text})" if low else text


def _own_lines(s: Script, node: ast.stmt) -> bool:
    """Whether the statement is alone on its lines (nothing but indentation before it, at most a comment after it)."""
    start, end = s.span(node)
    line_start, line_end = s.lines(node.lineno, node.end_lineno)
    after = s.data[end:line_end].strip()
    return not s.data[line_start:start].strip() and (not after or after.startswith(b"#"))


def _unit(s: Script, outer: ast.stmt, inner: ast.stmt) -> str | None:
    """The indentation one block level adds (`inner` sits one level below `outer`)."""
    a, b = s.indent_of(outer), s.indent_of(inner)
    return b[len(a) :] if b.startswith(a) and len(b) > len(a) and outer.lineno != inner.lineno else None


def _is_if(s: Script, node: ast.AST) -> bool:
    return isinstance(node, ast.If) and not node.orelse and s.data[s.span(node)[0] :].startswith(b"if ")


def _split_edits(s: Script) -> list[tuple[int, int, str]]:
    """`if a and b:` as `if a:` holding `if b:` (where there is no `else`)."""
    edits = []
    for node in s.of(ast.If):
        if not (_is_if(s, node) and isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And)):
            continue
        unit = _unit(s, node, node.body[0])
        if unit is None or not _own_lines(s, node) or has_multiline_string(s, node.test.end_lineno + 1, node.end_lineno):
            continue
        first, *rest = node.test.values
        ind = s.indent_of(node)
        inner = " and ".join(_operand(s, v) for v in rest) if len(rest) > 1 or "\n" in s.text(rest[0]) else s.text(rest[0])
        header = f"{ind}if {_operand(s, first)}:\n{ind}{unit}if {inner}:\n"
        edits.append((*s.lines(node.lineno, node.end_lineno), header + indented(s, node.test.end_lineno + 1, node.end_lineno, unit)))
    return edits


def _join_edits(s: Script) -> list[tuple[int, int, str]]:
    """`if a:` holding only `if b:` as `if a and b:` (where neither has an `else`)."""
    edits = []
    for node in s.of(ast.If):
        if not (_is_if(s, node) and len(node.body) == 1 and _is_if(s, node.body[0])):
            continue
        inner = node.body[0]
        unit = _unit(s, node, inner)
        if unit is None or not _own_lines(s, node) or has_multiline_string(s, inner.test.end_lineno + 1, inner.end_lineno):
            continue
        body = s.data[slice(*s.lines(inner.test.end_lineno + 1, inner.end_lineno))].decode().splitlines(keepends=True)
        if any(line.strip() and not line.startswith(s.indent_of(inner) + unit) for line in body):
            continue
        header = f"{s.indent_of(node)}if {_operand(s, node.test)} and {_operand(s, inner.test)}:\n"
        edits.append((*s.lines(node.lineno, node.end_lineno), header + "".join(line.removeprefix(unit) for line in body)))
    return edits


@transformation
def split_or_join_conditions(source: str) -> str | None:
    """`if a and b:` becomes nested `if a:` / `if b:`, and nested ifs with no `else` become one `if a and b:`."""
    s = script(source)
    edits = _split_edits(s) + _join_edits(s)
    # of nested candidates, the outermost only
    return s.edit([e for e in edits if not any(o is not e and o[0] <= e[0] and e[1] <= o[1] for o in edits)])


@transformation
def split_tuple_assign(source: str) -> str | None:
    """`a, b = x, y` becomes `a = x` then `b = y` where no later value reads an earlier target."""
    s = script(source)
    edits = []
    for node in s.of(ast.Assign):
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Tuple) or not isinstance(node.value, ast.Tuple):
            continue
        targets, values = node.targets[0].elts, node.value.elts
        if len(targets) != len(values) or not all(isinstance(t, ast.Name) for t in targets) or not _own_lines(s, node):
            continue
        read = [{n.id for n in ast.walk(v) if isinstance(n, ast.Name)} for v in values]
        if any(targets[i].id in read[j] for j in range(len(values)) for i in range(j)) or any(isinstance(v, ast.Starred) for v in values):
            continue
        ind = s.indent_of(node)
        text = "".join(f"{ind}{t.id} = {_operand(s, v)}\n" for t, v in zip(targets, values))
        edits.append((*s.lines(node.lineno, node.end_lineno), text))
    return s.edit(edits)
