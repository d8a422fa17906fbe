"""Assignments of one function or module body: name -> the expressions assigned to it, in order."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from graphify.analysis.names import dotted
from graphify.analysis.tree import children


@dataclass
class Scope:
    """Assignments of one function (or module) body: name -> value expressions, in source order."""

    values: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)

    def add(self, name: str, value: cst.BaseExpression) -> None:
        self.values.setdefault(name, []).append(value)


def target_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for el in target.elements for n in target_names(el.value)]
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    name = dotted(target)
    return [name] if name else []


def _bind(scope: Scope, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
    if isinstance(target, (cst.Tuple, cst.List)):
        values = value.elements if isinstance(value, (cst.Tuple, cst.List)) else None
        for i, el in enumerate(target.elements):
            if values is not None and i < len(values) and not isinstance(el, cst.StarredElement):
                _bind(scope, el.value, values[i].value)
            else:
                # Unpacking an opaque value: each part is bound to a subscript of it.
                part = cst.Subscript(value, [cst.SubscriptElement(cst.Index(cst.Integer(str(i))))])
                _bind(scope, el.value, part)
        return
    name = dotted(target)
    if name:
        scope.add(name, value)


_HOST_READS = {"tolist", "item", "numpy"}
_CONTAINERS = {"list", "tuple", "sorted", "int", "float"}


def forget_before_conversions(scope: Scope, statements) -> None:
    """`times = list(reversed(times.int().tolist()))` at the top level of a body: from there on the name
    holds the host value, never the tensor assigned before, so the earlier values are dropped (the code
    between them is rarely more than the conversion itself)."""
    for stmt in statements:
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Assign):
            continue
        assign = stmt.body[0]
        name = dotted(assign.targets[0].target) if len(assign.targets) == 1 else None
        values = scope.values.get(name or "", [])
        if name is None or not values or values[0] is assign.value or not _converts_to_host(assign.value, name):
            continue
        scope.values[name] = values[next(i for i, v in enumerate(values) if v is assign.value) :]


def _converts_to_host(value: cst.BaseExpression, name: str) -> bool:
    """A call that reads `name` on the host (`.tolist()`, `.item()`, `.numpy()`), maybe in a container."""
    while (
        isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in _CONTAINERS | {"reversed"} and value.args
    ):
        value = value.args[0].value
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in _HOST_READS):
        return False
    stack = [value.func.value]
    while stack:
        node = stack.pop()
        if dotted(node) == name:
            return True
        stack.extend(children(node))
    return False


def collect_scope(body: cst.CSTNode, scope: Scope | None = None) -> Scope:
    """Assignments in one body, without entering nested functions or classes."""
    scope = scope or Scope()
    if isinstance(body, (cst.FunctionDef, cst.ClassDef)):
        stack = list(reversed(body.body.body)) if isinstance(body.body, cst.IndentedBlock) else [body.body]
    else:
        stack = [body]
    while stack:
        node = stack.pop()
        kind = type(node)  # exact types: isinstance on libcst's abstract bases is slow
        if kind is cst.FunctionDef or kind is cst.ClassDef:
            continue
        if kind is cst.Assign:
            for t in node.targets:
                _bind(scope, t.target, node.value)
        elif kind is cst.AnnAssign and node.value is not None:
            _bind(scope, node.target, node.value)
        elif kind is cst.AugAssign:
            name = dotted(node.target)
            if name:
                scope.add(name, cst.BinaryOperation(node.target, cst.Add(), node.value))
        elif kind is cst.NamedExpr:
            _bind(scope, node.target, node.value)
        elif kind is cst.WithItem and node.asname is not None:
            _bind(scope, node.asname.name, node.item)
        stack.extend(reversed(children(node)))
    return scope
