"""Statement-level facts the rewriter needs: names read and written, GPU work versus host work."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from graphify.analysis.logging_calls import is_logging_call
from graphify.analysis.calls import is_model_call, is_step_op, method_call
from graphify.analysis.scope import target_names
from graphify.analysis.tree import children
from graphify.analysis.values import Env
from graphify.analysis.vocabulary import ACCELERATOR, MODEL, OPTIMIZER, SCALER, is_tensor_metadata_method, is_torch_tensor_call

_NESTED = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
# exact types, for the hottest loops (analysis/tree.py says why)
_NESTED_TYPES = frozenset(_NESTED)
_COMPREHENSIONS = (cst.GeneratorExp, cst.ListComp, cst.SetComp, cst.DictComp)
_TARGET_HOLDERS = frozenset((cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr))
HOST_READS = {"item", "tolist", "numpy", "cpu"}


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if type(n) not in _NESTED_TYPES or n is node:
            stack.extend(reversed(children(n)))


def names_written(node: cst.CSTNode) -> set[str]:
    out: set[str] = set()
    for n in walk(node):
        kind = type(n)
        if kind is cst.Assign:
            for t in n.targets:
                _add_targets(t.target, out)
        elif kind in _TARGET_HOLDERS:
            _add_targets(n.target, out)
        elif kind is cst.AsName:
            _add_targets(n.name, out)
        elif kind in (cst.MatchAs, cst.MatchStar) and n.name is not None:  # `case {"x": x}` and `case [x, *rest]` bind
            _add_targets(n.name, out)
        elif kind is cst.MatchMapping and n.rest is not None:
            _add_targets(n.rest, out)
    return out


def names_bound_by(target: cst.BaseExpression) -> set[str]:
    """The names an assignment to `target` binds (`a`, `b` of `for a, (b, c.d) in ...`)."""
    out = names_written(target)
    _add_targets(target, out)
    return out


def _add_targets(t: cst.BaseExpression, out: set[str]) -> None:
    if isinstance(t, cst.Name):
        out.add(t.value)
    elif isinstance(t, (cst.Tuple, cst.List)):
        for el in t.elements:
            _add_targets(el.value, out)
    elif isinstance(t, cst.StarredElement):
        _add_targets(t.value, out)


def names_read(node: cst.CSTNode, replaced: dict[int, tuple[str, ...]] | None = None) -> set[str]:  # noqa: C901 (one case per kind of node, in one place)
    """`replaced`: expressions (by id) read as the names given instead (as the captured step reads a drawn
    expression, or the host half of a statement the planner splits reads what the graph computed)."""
    out: set[str] = set()

    def visit(n: cst.CSTNode) -> None:
        if replaced and id(n) in replaced:
            out.update(replaced[id(n)])
        elif isinstance(n, cst.Name):
            out.add(n.value)
        elif isinstance(n, cst.Attribute):
            visit(n.value)
        elif isinstance(n, cst.Arg):
            visit(n.value)
        elif isinstance(n, cst.Assign):
            for t in n.targets:
                visit_target(t.target)
            visit(n.value)
        elif isinstance(n, cst.AnnAssign):
            visit_target(n.target)
            if n.value is not None:
                visit(n.value)
        elif isinstance(n, cst.CompFor):
            visit(n.iter)
            for cond in n.ifs:
                visit(cond)
            if n.inner_for_in is not None:
                visit(n.inner_for_in)
        elif isinstance(n, _COMPREHENSIONS):  # its `for` targets are its own names, not the enclosing scope's
            bound, f = set(), n.for_in
            while f is not None:
                bound.update(target_names(f.target))
                f = f.inner_for_in
            out.update(set().union(*(names_read(c, replaced) for c in children(n))) - bound, names_read(n.for_in.iter, replaced))
        elif isinstance(n, cst.AsName):
            return
        elif isinstance(n, _NESTED):
            return
        else:
            for c in children(n):
                visit(c)

    def visit_target(t: cst.CSTNode) -> None:
        if isinstance(t, (cst.Tuple, cst.List)):
            for el in t.elements:
                visit_target(el.value)
        elif isinstance(t, cst.Attribute):
            visit(t.value)
        elif isinstance(t, cst.Subscript):
            visit(t.value)
            for s in t.slice:
                visit(s)
        elif isinstance(t, cst.StarredElement):
            visit_target(t.value)

    visit(node)
    return out


def names_in_order(node: cst.CSTNode, replaced: dict[int, tuple[str, ...]] | None = None) -> list[str]:
    """The names `node` writes or reads, in the order its code does (repeats kept); `replaced` as for names_read."""
    out: list[str] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if replaced and id(n) in replaced:
            out.extend(replaced[id(n)])
            continue
        if isinstance(n, cst.Name):
            out.append(n.value)
        if type(n) not in _NESTED_TYPES or n is node:
            stack.extend(reversed(children(n)))
    return out


def is_host_read_call(call: cst.Call, env: Env) -> bool:
    m = method_call(call)
    if m is not None and m[1] in HOST_READS:
        return True
    if isinstance(call.func, cst.Name) and call.func.value in ("float", "int", "bool", "str", "repr"):
        return True
    return is_logging_call(call, env)


def does_gpu_work(node: cst.CSTNode, env: Env) -> bool:
    """Whether a statement launches GPU work (beyond reading results back to the host)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, _NESTED) and n is not node:
            continue
        if isinstance(n, cst.Call):
            if id(n) in env.gpu_calls:
                return True
            if is_host_read_call(n, env):
                continue
            if is_model_call(n, env) or is_step_op(n, env) or is_torch_tensor_call(env.qualify(n.func)) or env.is_tensor(n):
                return True
            m = method_call(n)
            if m is not None:
                kind = env.kind_of(m[0])
                if m[1] == "zero_grad" and kind in (OPTIMIZER, MODEL):
                    return True
                if kind == SCALER and m[1] in ("scale", "unscale_"):
                    return True
                if kind == ACCELERATOR and m[1] in ("clip_grad_norm_", "clip_grad_value_"):
                    return True  # clips on the device (unscaling first under fp16, which the runtime runs eagerly)
                if (env.is_tensor(m[0]) and not is_tensor_metadata_method(m[1])) or _in_place_on_data(*m):
                    return True
        elif isinstance(n, cst.BinaryOperation) and (env.is_tensor(n.left) or env.is_tensor(n.right)):
            return True
        elif isinstance(n, (cst.AugAssign,)) and (env.is_tensor(n.target) or env.is_tensor(n.value)):
            return True
        stack.extend(children(n))
    return False


def _in_place_on_data(receiver: cst.BaseExpression, method: str) -> bool:
    """`p.data.copy_(...)`, `p.grad.zero_()`: an in-place op on a parameter's data or gradient."""
    return (
        method.endswith("_")
        and not method.startswith("_")
        and isinstance(receiver, cst.Attribute)
        and receiver.attr.value in ("data", "grad")
    )


def contains(root: cst.CSTNode, node: cst.CSTNode) -> bool:
    return any(n is node for n in walk(root))


def is_side_computation(stmt: cst.BaseStatement, env: Env) -> bool:
    """A plain (re)binding of names that neither runs the model nor steps, e.g. a metric accumulator, or
    the next batch fetched while the step runs (`X, Y = get_batch("train")`); or a list filled with such
    values (`losses.append(loss.detach())`). Nothing in it changes a tensor in place."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    if collected_into(stmt):
        targets = []
    elif all(isinstance(s, (cst.Assign, cst.AugAssign)) for s in stmt.body):
        targets = [t.target for s in stmt.body for t in (s.targets if isinstance(s, cst.Assign) else [s])]
        targets = [t.target if isinstance(t, cst.AssignTarget) else t for t in targets]
        targets = [e.value for t in targets for e in (t.elements if isinstance(t, (cst.Tuple, cst.List)) else [cst.Element(t)])]
    else:
        return False
    if not all(isinstance(t, cst.Name) for t in targets):
        return False
    return not any(
        isinstance(n, cst.Call) and (is_step_op(n, env) or is_model_call(n, env) or id(n) in env.gpu_calls or _mutates(n))
        for n in walk(stmt)
    )


def collected_into(stmt: cst.BaseStatement) -> set[str]:
    """The list a statement appends to or extends (`losses.append(...)`), by name; else nothing."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    call = small.value if isinstance(small, cst.Expr) else None
    m = method_call(call) if isinstance(call, cst.Call) else None
    return {m[0].value} if m is not None and m[1] in ("append", "extend") and isinstance(m[0], cst.Name) else set()


def _mutates(call: cst.Call) -> bool:
    m = method_call(call)
    return m is not None and m[1].endswith("_") and not m[1].startswith("_")


def exit_else(stmt: cst.BaseStatement) -> cst.BaseSuite | None:
    """The `else:` block of `if ok: ... else: break` (or `continue`, `return ...`): one exit, no `elif`.
    The `if` is a guard: the iteration goes on while `ok` holds, as after `if not ok: break`."""
    if not isinstance(stmt, cst.If) or not isinstance(stmt.orelse, cst.Else) or not isinstance(stmt.body, cst.IndentedBlock):
        return None
    block = stmt.orelse.body
    lines = block.body if isinstance(block, cst.IndentedBlock) else [block]
    if len(lines) != 1 or not isinstance(lines[0], (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return None
    small = lines[0].body
    return block if len(small) == 1 and isinstance(small[0], (cst.Break, cst.Continue, cst.Return)) else None


def unguarded(statements) -> list[cst.BaseStatement]:
    """Statements in the order they run, the branch of each guard (`if ok: ... else: break`) in its place."""
    out = []
    for stmt in statements:
        out.extend(unguarded(stmt.body.body) if exit_else(stmt) is not None else [stmt])
    return out
