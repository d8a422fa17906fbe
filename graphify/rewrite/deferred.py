"""`graphify rewrite --defer-host-reads`: the statements after the replay that only read the step's results
for the host (logging, bookkeeping) run one step later, so that the host queues the next replay before it
waits for this one. docs/usage.md tells the exact semantics; in short:

The deferred statements are the longest run of statements at the end of the loop body, after the replay,
that passes every check below. At the end of each pass the values they read are held
(`DeferredReads.push`: tensors copied to host memory without waiting), and the statements run with the
previous pass's values; when the loop ends (its end, `break`, `return`, an exception) the last pass's run
(`flush`, in a `finally`). They print the same lines, in the same order, with the same values: the lines
of a step appear after the next step's replay is queued.

A statement is deferred only when nothing else can tell: it has no `break`, `continue`, `return`, `raise`,
`yield`, `await`, `del`, `global`, `nonlocal`, `:=`, `lambda`, comprehension, `try`, `while`, `with` (but
a mode block such as `torch.no_grad()`), assert, nested definition or import, nor an f-string `{x=}`; it
calls only builtins that print or convert (`print`, `len`, `float`, ...) and bookkeeping methods
(`append`, `update`, `add_scalar`, `log`, ...) of objects that nothing else in the loop names (by their
attribute path: `self.history` beside `self.model`); the names it binds nothing else in the loop names; a step output it reads only through `.item()`, `.tolist()`,
`float()`, `int()`, `.detach().cpu()` or its shape. And only when the rest of the loop (its header for
`while`, what runs before the replay, the step, the statements after the replay that stay) prints
nothing: no `print`, no logging or writer call; otherwise the lines would come out in another order.
What the deferred statements read that the rest of the loop binds or may change (calls a method of, hands
to a call, assigns an item or attribute of) is held at the end of each
pass: a tensor read through `.item()` and the like as a host copy, a tensor whose shape alone is read as
it is, anything else only if it is immutable (a number, a string, a tuple of them); a value that is not
makes the runtime run the statements at once, as without the option.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from graphify.analysis.statements import names_written, walk
from graphify.analysis.tree import children
from graphify.analysis.values import Env
from graphify.analysis.vocabulary import DDP, LOSS, MODEL
from graphify.analysis.step_body import is_mode_block
from graphify.plan.base import Plan, fresh_name
from graphify.rewrite.splits import hoisted_halves, split_if

DEFERRED_READS = "DeferredReads"

BUILTINS = frozenset({"print", "len", "float", "int", "str", "round", "abs", "min", "max", "bool", "repr", "format", "sum"})
BOOKKEEPING = frozenset(
    {"append", "extend", "insert", "update", "add", "setdefault", "get", "items", "keys", "values", "format", "join"}
    | {"add_scalar", "add_scalars", "log", "log_metrics", "info", "debug", "warning", "write", "flush"}
    | {"set_postfix", "set_postfix_str", "set_description"}
)
OUTPUT_METHODS = frozenset(
    {"log", "log_metrics", "info", "debug", "warning", "warn", "error", "exception", "critical", "write", "writelines"}
    | {"print", "add_scalar", "add_scalars", "set_postfix", "set_postfix_str", "set_description", "flush", "display"}
)
HOST_CHAIN = frozenset({"detach", "cpu", "item", "tolist", "numpy"})
SHAPE_METHODS, SHAPE_ATTRS = frozenset({"size", "dim", "numel"}), frozenset({"shape", "ndim"})
_REFUSED = (
    cst.Break,
    cst.Continue,
    cst.Return,
    cst.Raise,
    cst.Yield,
    cst.Await,
    cst.Global,
    cst.Nonlocal,
    cst.Del,
    cst.NamedExpr,
    cst.Lambda,
    cst.FunctionDef,
    cst.ClassDef,
    cst.Import,
    cst.ImportFrom,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
    cst.GeneratorExp,
    cst.Try,
    cst.While,
    cst.Assert,
    cst.Match,
)
_GROUPS = ("keep", "copy", "value")  # a name read in several ways is held in the strictest way


@dataclass
class Deferral:
    reads: str  # the DeferredReads object of the loop
    first: int  # the statements after the replay (after_replay) from this one on are deferred
    held: dict[str, list[str]] = field(default_factory=dict)  # "copy" / "keep" / "value" -> names, in order
    renamed: dict[str, str] = field(default_factory=dict)  # a held name -> its name in the deferred statements


@dataclass
class _Loop:
    """What the rest of the loop does with names: mentions them, binds them, reads paths (`self.model`) or
    may change the objects at paths (calls a method of, hands to a call, assigns an item or attribute of)."""

    mentioned: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    touched: set[str] = field(default_factory=set)
    prints: bool = False
    env: Env | None = None  # the loop body's: which paths hold a model or a loss function


# ---- the statements ----------------------------------------------------------------------------


def _name_nodes(node: cst.CSTNode):
    """(Name, its parent, its grandparent) for each name read or bound: attribute names and keywords left out."""
    stack = [(node, None, None)]
    while stack:
        n, parent, grand = stack.pop()
        if isinstance(n, cst.Name):
            skipped = (isinstance(parent, cst.Attribute) and parent.attr is n) or (isinstance(parent, cst.Arg) and parent.keyword is n)
            if not skipped:
                yield n, parent, grand
            continue
        stack.extend((c, n, parent) for c in reversed(children(n)))


def _path(expr: cst.CSTNode) -> str | None:
    """The object an expression names, as a path: `self.history` for `self.history` and for
    `self.history["loss"]` (an item of it); after a call only the name at its root (the call may return
    anything); None without a name at its root."""
    parts: list[str] | None = []
    while isinstance(expr, (cst.Attribute, cst.Subscript, cst.Call)):
        if isinstance(expr, cst.Attribute) and parts is not None:
            parts.append(expr.attr.value)
        elif isinstance(expr, cst.Subscript) and parts is not None:
            parts.clear()
        elif isinstance(expr, cst.Call):
            parts = None
        expr = expr.func if isinstance(expr, cst.Call) else expr.value
    if not isinstance(expr, cst.Name):
        return None
    return ".".join([expr.value, *reversed(parts)]) if parts else expr.value


def _overlap(a: str, b: str) -> bool:
    """Whether two paths can name the same object or one inside the other."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _store_roots(stmt: cst.CSTNode) -> set[str]:
    """Objects (paths) a statement changes by an item or attribute assignment (`stats["loss"] = ...`)."""
    targets = []
    for n in walk(stmt):
        if isinstance(n, cst.Assign):
            targets.extend(t.target for t in n.targets)
        elif isinstance(n, (cst.AugAssign, cst.AnnAssign)):
            targets.append(n.target)
    found = set()
    while targets:
        t = targets.pop()
        if isinstance(t, (cst.Tuple, cst.List)):
            targets.extend(e.value for e in t.elements)
        elif isinstance(t, (cst.Attribute, cst.Subscript)) and _path(t.value) is not None:
            found.add(_path(t.value))
    return found


def _calls(stmt: cst.CSTNode) -> list[cst.Call]:
    """The calls of a statement; a mode block's own `torch.no_grad()` left out."""
    found, stack = [], [stmt]
    while stack:
        n = stack.pop()
        if is_mode_block(n):
            stack.extend(n.body.body)
            continue
        if isinstance(n, cst.Call):
            found.append(n)
        stack.extend(children(n))
    return found


def _may_defer(stmt: cst.BaseStatement) -> bool:
    """The statement alone: nothing in it that another statement, or the loop, could tell apart."""
    for n in walk(stmt):
        if isinstance(n, _REFUSED) or (isinstance(n, cst.With) and not is_mode_block(n)):
            return False
        if isinstance(n, cst.For) and (n.orelse is not None or n.asynchronous is not None):
            return False
        if isinstance(n, cst.FormattedStringExpression) and n.equal is not None:
            return False  # `f"{loss=}"` prints the name, which the deferred statements rename
    for call in _calls(stmt):
        func = call.func
        if isinstance(func, cst.Name) and func.value in BUILTINS:
            continue
        if not (isinstance(func, cst.Attribute) and func.attr.value in HOST_CHAIN | SHAPE_METHODS | BOOKKEEPING):
            return False
    return True


def _form(parent, grand) -> str:
    """How a deferred statement reads a name the rest of the loop binds: "copy" (a host read of a tensor,
    `x.item()`), "keep" (its shape), or "value" (anything else)."""
    if isinstance(parent, cst.Attribute) and parent.attr.value in SHAPE_ATTRS:
        return "keep"
    if isinstance(parent, cst.Attribute) and parent.attr.value in SHAPE_METHODS and isinstance(grand, cst.Call):
        return "keep"
    if isinstance(parent, cst.Arg) and isinstance(grand, cst.Call) and isinstance(grand.func, cst.Name) and len(grand.args) == 1:
        return {"len": "keep", "float": "copy", "int": "copy"}.get(grand.func.value, "value")
    return "value"


def _host_chain(name: cst.Name, ancestors: dict[int, tuple]) -> tuple[list[str], cst.CSTNode, tuple]:
    """`name.detach().cpu().item()`: the methods called on the name without arguments, the outermost call,
    and its (parent, grandparent)."""
    methods, node = [], name
    parent, grand = ancestors[id(node)]
    while isinstance(parent, cst.Attribute) and parent.attr.value in HOST_CHAIN and isinstance(grand, cst.Call) and not grand.args:
        methods.append(parent.attr.value)
        node = grand
        parent, grand = ancestors[id(node)]
    return methods, node, (parent, grand)


def _ancestors(statements: list[cst.CSTNode]) -> dict[int, tuple]:
    """Each node's (parent, grandparent), by id."""
    ancestors: dict[int, tuple] = {}
    for stmt in statements:
        stack = [(stmt, None, None)]
        while stack:
            n, parent, grand = stack.pop()
            ancestors[id(n)] = (parent, grand)
            stack.extend((c, n, parent) for c in reversed(children(n)))
    return ancestors


def _read_path(name: cst.Name, ancestors: dict[int, tuple], env: Env | None = None) -> str:
    """What a name's occurrence reads, as a path: `args.log_interval`; `args` for `args.method()`, but
    `self.model` for `self.model(x)`, a model or a loss function called (`env` tells them)."""
    path, node = name.value, name
    parent, grand = ancestors[id(node)]
    while isinstance(parent, cst.Attribute) and parent.value is node:
        if isinstance(grand, cst.Call) and grand.func is parent and not _called_object(parent, env):
            break
        path, node = f"{path}.{parent.attr.value}", parent
        parent, grand = ancestors[id(node)]
    return path


def _called_object(func: cst.BaseExpression, env: Env | None) -> bool:
    """`self.model(x)`, `self.criterion(out, y)`: a call of the object at that path, not a method of its owner."""
    return env is not None and env.kind_of(func) in (MODEL, DDP, LOSS)


def _reads(statements: list[cst.BaseStatement]) -> list[tuple[str, str, str]]:
    """(name, how it is read, the path read) for each name the statements read, in order; a builtin they
    call left out."""
    ancestors = _ancestors(statements)
    found = []
    for stmt in statements:
        for name, parent, grand in _name_nodes(stmt):
            if isinstance(parent, cst.Call) and parent.func is name and name.value in BUILTINS:
                continue
            methods, _, (outer, outer_grand) = _host_chain(name, ancestors)
            if {"item", "tolist"} & set(methods) or {"detach", "cpu"} <= set(methods):
                form = "copy"
            elif set(methods) <= {"detach", "cpu"} and _form(outer, outer_grand) == "copy":
                form = "copy"
            else:
                form = _form(parent, grand) if not methods else "value"
            found.append((name.value, form, _read_path(name, ancestors)))
    return found


# ---- the rest of the loop ----------------------------------------------------------------------


def _handed(call: cst.Call, env: Env | None) -> set[str]:
    """The objects a call may change: its receiver (or the object called) and its arguments. A receiver that
    is a call's result (`scaler.scale(loss).backward()`) is reached from what that call was handed."""
    func = call.func
    if isinstance(func, cst.Attribute) and not _called_object(func, env):
        found = set() if any(isinstance(n, cst.Call) for n in walk(func.value)) else {_path(func.value)}
    else:
        found = {_path(func)}
    for arg in call.args:
        found |= _passed(arg.value)
    return found - {None}


_NEW_VALUES = (cst.Call, cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.BaseNumber, cst.BaseString)


def _passed(expr: cst.BaseExpression) -> set[str | None]:
    """The objects an argument hands over: a path (`args.device`), either side of `a if c else b` or of
    `a or b`, the items of a display; nothing for a new value (`x + 1`, a call's result, whose call hands
    its own); every name in anything else."""
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Subscript)):
        return {_path(expr)}
    if isinstance(expr, cst.IfExp):
        return _passed(expr.body) | _passed(expr.orelse)
    if isinstance(expr, cst.BooleanOperation):
        return _passed(expr.left) | _passed(expr.right)
    if isinstance(expr, (cst.Tuple, cst.List, cst.Set)):
        return set().union(*(_passed(e.value) for e in expr.elements))
    if isinstance(expr, _NEW_VALUES):
        return set()
    return {n.value for n, _, _ in _name_nodes(expr)}


def _add(loop: _Loop, node: cst.CSTNode) -> None:
    names = list(_name_nodes(node))
    ancestors = _ancestors([node]) if names else {}
    loop.mentioned |= {n.value for n, _, _ in names}
    loop.paths |= {_read_path(n, ancestors, loop.env) for n, _, _ in names}
    loop.written |= names_written(node)
    loop.touched |= _store_roots(node)
    for call in (n for n in walk(node) if isinstance(n, cst.Call)):
        loop.touched |= _handed(call, loop.env)
        func = call.func
        if (isinstance(func, cst.Name) and func.value in ("print", "pprint")) or (
            isinstance(func, cst.Attribute) and func.attr.value in OUTPUT_METHODS
        ):
            loop.prints = True


def _rest_of_loop(plan: Plan, kept_after: list[cst.BaseStatement]) -> _Loop:
    """The loop but the deferred statements: its header, what runs before the replay, the step, and the
    statements after the replay that are not deferred."""
    loop, stmts = _Loop(env=plan.loop.region.body_block.env), plan.statements
    node = plan.loop.node
    if isinstance(node, cst.For):  # its iterable steps on each pass (a logger's `log_every` prints its meters)
        targets = {n.value for n, _, _ in _name_nodes(node.target)}
        iterable = list(_name_nodes(node.iter))
        ancestors = _ancestors([node.iter]) if iterable else {}
        loop.mentioned |= targets | {n.value for n, _, _ in iterable}
        loop.paths |= targets | {_read_path(n, ancestors) for n, _, _ in iterable}
        loop.written |= targets
    else:
        _add(loop, node.test)
    moved = set(plan.after) | set(plan.tail)
    for i, stmt in enumerate(stmts):
        if i in plan.hoisted:
            _add(loop, hoisted_halves(stmt, plan.hoisted[i])[0])
        elif i in plan.split_ifs:
            _add(loop, split_if(stmt, plan.split_ifs[i])[0])
        elif i not in moved and i <= plan.last:
            _add(loop, stmt)
    for stmt in kept_after:
        _add(loop, stmt)
    for name, expr in plan.draws.values():
        _add(loop, expr)
        loop.mentioned.add(name)
        loop.paths.add(name)
        loop.written.add(name)
    loop.mentioned |= set(plan.inputs) | set(plan.outputs) | set(plan.clones)
    loop.paths |= set(plan.inputs) | set(plan.outputs) | set(plan.clones)
    loop.written |= set(plan.outputs) | set(plan.clones)
    return loop


# ---- the plan ----------------------------------------------------------------------------------


def plan_deferral(plan: Plan, after: list[cst.BaseStatement], taken: set[str], reads: str) -> Deferral | None:
    """The statements after the replay (`after`, in order) deferred by one step, or None."""
    if not isinstance(plan.loop.node, (cst.For, cst.While)) or plan.loop.node.orelse is not None:
        return None
    if isinstance(plan.loop.node, cst.For) and plan.loop.node.asynchronous is not None:
        return None
    if any(isinstance(n, (cst.Yield, cst.Await)) for n in walk(plan.loop.node.body)):
        return None
    first = len(after)
    while first > 0 and _may_defer(after[first - 1]):
        first -= 1
    for start in range(first, len(after)):
        held = _held(plan, after[:start], after[start:])
        if held is not None:
            renamed = {name: fresh_name(f"{name}_host", taken) for group in held.values() for name in group}
            return Deferral(fresh_name(reads, taken), start, held, renamed)
    return None


def _held(plan: Plan, kept: list[cst.BaseStatement], deferred: list[cst.BaseStatement]) -> dict[str, list[str]] | None:
    """What the deferred statements read that is held at the end of each pass, by how it is held; None when
    they cannot be deferred beside the rest of the loop, or read nothing of the step's results."""
    loop = _rest_of_loop(plan, kept)
    bound = set().union(*(names_written(s) for s in deferred))
    if loop.prints or bound & loop.mentioned:
        return None
    changed = {p for s in deferred for p in _store_roots(s)} | {
        _path(c.func.value) for s in deferred for c in _calls(s) if isinstance(c.func, cst.Attribute) and c.func.attr.value in BOOKKEEPING
    }
    if any(_overlap(c, p) for c in changed - {None} for p in loop.paths):
        return None  # an object they change that the rest of the loop reads too
    held: dict[str, str] = {}
    for name, form, path in _reads(deferred):
        if name in bound or (name not in loop.written and not any(_overlap(path, t) for t in loop.touched)):
            continue  # the deferred statements' own, or nothing else changes it: read when they run
        held[name] = max(held.get(name, form), form, key=_GROUPS.index)
    if any(form == "value" and name in set(plan.outputs) | set(plan.clones) for name, form in held.items()):
        return None  # a step output read as a tensor: a host copy would print otherwise
    if "copy" not in held.values():
        return None  # no read of a step's result to wait for: nothing gained
    return {group: [n for n, f in held.items() if f == group] for group in ("copy", "keep", "value")}


# ---- the code ----------------------------------------------------------------------------------


class _Renamed(cst.CSTTransformer):
    def __init__(self, renamed: dict[str, str]) -> None:
        self.renamed = renamed

    def leave_Name(self, original, updated):
        return updated.with_changes(value=self.renamed[updated.value]) if updated.value in self.renamed else updated

    def leave_Attribute(self, original, updated):
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original, updated):
        return updated.with_changes(keyword=original.keyword)


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment(f"# graphify: {text}"))


def deferred_run(deferral: Deferral, statements: list[cst.BaseStatement], flush: bool) -> cst.For:
    """`for loss_host, step_host in reads.push(copy=(loss,), value=(step,)): <statements>`, or over
    `reads.flush()` for the loop's end."""
    held = [n for group in ("copy", "keep", "value") for n in deferral.held[group]]
    targets = ", ".join(deferral.renamed[n] for n in held)
    targets = f"({targets},)" if len(held) == 1 else targets
    args = ", ".join(f"{g}=({', '.join(ns)}{',' if len(ns) == 1 else ''})" for g, ns in deferral.held.items() if ns)
    call = f"{deferral.reads}.flush()" if flush else f"{deferral.reads}.push({args})"
    body = [s.visit(_Renamed(deferral.renamed)) for s in statements]
    body[0] = body[0].with_changes(leading_lines=[line for line in body[0].leading_lines if line.comment])
    loop = cst.parse_statement(f"for {targets} in {call}:\n    pass\n")
    why = (
        "when the loop ends, however it ends: the last step's deferred host reads"
        if flush
        else "host reads run one step later (--defer-host-reads): this step's values are held (tensors copied to "
        "host memory without waiting), the previous step's reads run here"
    )
    return loop.with_changes(body=loop.body.with_changes(body=body), leading_lines=[_comment(why)])


def with_flush(loop: cst.For | cst.While, deferral: Deferral, statements: list[cst.BaseStatement]) -> cst.Try:
    """The loop in a `try` whose `finally` runs the last step's deferred statements, however the loop ends."""
    inner = loop.with_changes(leading_lines=[])
    final = cst.Finally(body=cst.IndentedBlock(body=[deferred_run(deferral, statements, flush=True)]))
    return cst.Try(body=cst.IndentedBlock(body=[inner]), finalbody=final, leading_lines=loop.leading_lines)


def reads_object(deferral: Deferral, class_name: str) -> cst.BaseStatement:
    return cst.parse_statement(f"{deferral.reads} = {class_name}()")
