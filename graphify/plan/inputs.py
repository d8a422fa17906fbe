"""The captured step's inputs (re-bound each step, copied into static buffers), outputs, and the outputs
that must be copied because they outlive the next replay."""

from __future__ import annotations

import libcst as cst

from graphify.analysis.calls import method_call
from graphify.analysis.statements import (
    names_bound_by,
    names_in_order,
    names_read,
    names_written,
    walk,
)
from graphify.analysis.tree import children
from graphify.analysis.values import Env
from graphify.plan import dataflow
from graphify.plan.base import Plan, if_chain, is_shape_read, kept_roots, rebound_in_loop
from graphify.plan.draws import drawn_names
from graphify.plan.refusals import (
    HOST_BRANCH_IN_STEP,
    LOOP_SHAPE,
    PER_STEP_HOST_VALUE,
)


class _StepStatement:
    """A statement of the step as the graph runs it, read from the plan's description, nothing built: a
    statement split by the planner (plan.hoisted) as its captured half, a keyed `if` without the host
    statements that leave it (plan.split_ifs), each drawn expression as the input that replaces it."""

    def __init__(self, plan: Plan, body: list[cst.BaseStatement], index: int) -> None:
        self.source, self.hoist, self.drawn = body[index], plan.hoisted.get(index), drawn_names(plan)
        self.split = index in plan.split_ifs
        self.roots = [] if self.hoist else captured_roots(plan, body, index)

    def written(self) -> set[str]:
        return set(self.hoist.names) if self.hoist else set().union(*map(names_written, self.roots))

    def read_before_bound(self, bound: set[str]) -> set[str]:
        if self.hoist:
            return self.hoist.captured_reads(self.source) - bound
        if self.split:  # its tests and kept statements, as names_read reads an `if`
            return set().union(*(names_read(r, self.drawn) for r in self.roots)) - bound
        return _read_before_bound(self.source, bound, self.drawn)

    def names_in_order(self) -> list[str]:
        if self.hoist:
            return self.hoist.captured_names_in_order(self.source)
        return [name for r in self.roots for name in names_in_order(r, self.drawn)]

    def readers(self, name: str) -> list[cst.CSTNode]:
        """The source's statements that read `name` where the step runs them, for `check` to point at."""
        if self.hoist:
            return [self.source] if name in self.hoist.captured_reads(self.source) else []
        return _statements_reading(name, [self.source])


def find_inputs_outputs(plan: Plan, body: list[cst.BaseStatement], env: Env, enclosing: cst.CSTNode, refuse) -> None:
    target = plan.loop.node.target if isinstance(plan.loop.node, cst.For) else None
    if target is not None and any(isinstance(n, (cst.Subscript, cst.Attribute)) for n in _target_slots(target)):
        # `for cur["x"], cur["y"] in data`: the step would read the batch through the object, a replay its first one
        refuse(LOOP_SHAPE, target, "the loop binds its items to an item or attribute of an object, not to names the step can take in")
    step = [_StepStatement(plan, body, i) for i in plan.graph]
    written = set().union(*(s.written() for s in step))
    per_iteration = rebound_in_loop(plan.loop) - written if step else set()
    per_iteration |= set().union(*(names_written(body[i]) for i in range(len(body)) if i not in plan.graph))
    if isinstance(plan.loop.node, cst.For):
        per_iteration |= names_bound_by(plan.loop.node.target)
    # by every node: a statement opened from a mode block is a copy, its statements are the source's; the
    # host statements of keyed ifs run after the call, and read what the step binds as code outside it does
    captured = {
        id(n) for i in plan.graph for root in ([body[i]] if i in plan.hoisted else captured_roots(plan, body, i)) for n in walk(root)
    }
    outside = _names_read_outside(enclosing, captured)
    outside |= set().union(*(names_read(body[i], _as_names(hoist.replaced)) for i, hoist in plan.hoisted.items()))
    # a name the function declares `global` is bound outside it, at module level
    defined_outside = _names_written_outside(enclosing, captured) | per_iteration | env.declared_global()
    read_first: set[str] = set()  # names the step reads before it binds them itself
    bound: set[str] = set()
    for stmt in step:
        read_first |= stmt.read_before_bound(bound)
        bound |= stmt.written()
    inputs = []
    this_loop = names_written(plan.loop.node)
    for name in sorted(read_first):
        if name in per_iteration or (name in written and name in defined_outside):
            if dataflow.is_host_name(name, env) and not is_shape_value(name, body):
                if name not in this_loop and name not in written:
                    # a number an enclosing loop sets (`lr /= 4` each epoch): fixed while this loop runs, so
                    # it is a host input, and the runtime keeps one graph per value it takes
                    inputs.append(name)
                elif not _only_in_keys(name, plan, body):
                    why = f"the step reads `{name}`, a host value that changes between steps; capture would freeze it"
                    for reader in [r for stmt in step for r in stmt.readers(name)] or [None]:
                        refuse(PER_STEP_HOST_VALUE, reader, why)
                continue
            inputs.append(name)
    order = [name for stmt in step for name in stmt.names_in_order()]
    plan.inputs = _in_source_order(inputs + [name for name, _ in plan.draws.values()], order)
    # an input the step binds again (`X, Y = get_batch()` after the forward) is read by the next step's call
    plan.outputs = _in_source_order([n for n in written if n in outside or n in inputs], order)
    _refuse_outputs_bound_on_some_steps(plan, body, refuse)
    after_loop = _names_read_outside(enclosing, {id(plan.loop.node)})
    plan.clones = [n for n in plan.outputs if n in after_loop or _kept_in_loop(n, body, plan)]


def captured_roots(plan: Plan, body: list[cst.BaseStatement], index: int) -> list[cst.CSTNode]:
    """What the graph runs of a statement of the step: all of it, or of a keyed `if` its tests and the
    statements the step keeps."""
    return kept_roots(body[index], plan.split_ifs[index]) if index in plan.split_ifs else [body[index]]


def _as_names(replaced: dict[int, str]) -> dict[int, tuple[str, ...]]:
    return {key: (name,) for key, name in replaced.items()}


def _refuse_outputs_bound_on_some_steps(plan: Plan, body: list[cst.BaseStatement], refuse) -> None:
    """An output that only keyed `if`s bind (`if i % k == 0: loss = ...`, read after the step) keeps an
    earlier step's value on the steps that skip the branch. The captured step returns what it binds, and
    has nothing to return there, so such a step is not captured whole."""
    for name in plan.outputs:
        if name in plan.inputs:
            continue  # on the other steps the step returns what it was handed, as eager code keeps it
        binders = [i for i in plan.graph if name in names_written(body[i])]
        if binders and all(i in plan.keys and not _bound_on_every_outcome(body[i], name) for i in binders):
            why = f"`{name}` is bound only on steps that take this branch; the others read an earlier step's `{name}`, which the captured step cannot return"
            refuse(HOST_BRANCH_IN_STEP, body[binders[0]], why)


def _bound_on_every_outcome(stmt: cst.If, name: str) -> bool:
    """`if use_amp: loss = ... else: loss = ...`: every branch, an `else` among them, binds the name."""
    chain = if_chain(stmt)
    return chain.has_else and all(name in set().union(*map(names_written, branch)) for branch in chain.branches)


def _target_slots(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The places a loop target binds: `a`, `b` and `c.d` in `for a, (b, c.d) in ...`."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [slot for el in target.elements for slot in _target_slots(el.value)]
    return _target_slots(target.value) if isinstance(target, cst.StarredElement) else [target]


def _read_before_bound(stmt: cst.BaseStatement, bound: set[str], drawn: dict[int, tuple[str, ...]]) -> set[str]:
    """Names `stmt` reads before it binds them, given the names `bound` before it. A `for` body is
    followed statement by statement: `for _ in range(k): loss = model(x); loss.backward()` reads no
    earlier `loss`, while a body that reads a name before rebinding it reads the last pass's value."""
    if isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):  # `out = model(x); loss = f(out)`
        reads, inner = set(), set(bound)
        for small in stmt.body:
            reads |= names_read(small, drawn) - inner
            inner |= names_written(small)
        return reads
    if isinstance(stmt, cst.With):  # its body, in order, after the items
        reads = set().union(*(names_read(item.item, drawn) for item in stmt.items)) - bound
        inner = bound | set().union(*(names_written(item.asname.name) for item in stmt.items if item.asname))
        return reads | _block_reads(stmt.body, inner, drawn)
    if not (isinstance(stmt, cst.For) and stmt.orelse is None):
        return names_read(stmt, drawn) - bound
    reads = names_read(stmt.iter, drawn) - bound
    inner = bound | names_bound_by(stmt.target)
    return reads | _block_reads(stmt.body, inner, drawn)


def _block_reads(block: cst.BaseSuite, bound: set[str], drawn: dict[int, tuple[str, ...]]) -> set[str]:
    if isinstance(block, cst.SimpleStatementSuite):
        return _read_before_bound(block, bound, drawn)
    reads, inner = set(), set(bound)
    for s in block.body:
        reads |= _read_before_bound(s, inner, drawn)
        inner |= names_written(s)
    return reads


def _statements_reading(name: str, stmts) -> list[cst.CSTNode]:
    """The innermost statements of `stmts` that read `name` (a `for` or `with` where its header does),
    for `check` to point at. A host `if`/`while` on the value is a host branch (keyed, or the host-branch
    rules' concern), not a value the GPU work reads."""
    found = []
    for stmt in stmts:
        if isinstance(stmt, cst.SimpleStatementLine):
            if name in names_read(stmt):
                found.append(stmt)
            continue
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        header, inner, stack = [], [], [c for c in children(stmt) if not (isinstance(stmt, cst.For) and c is stmt.target)]
        while stack:
            n = stack.pop()
            if isinstance(n, cst.BaseStatement):
                inner.append(n)
            elif isinstance(n, (cst.BaseExpression, cst.WithItem)):
                header.append(n)
            else:
                stack.extend(children(n))
        if not isinstance(stmt, (cst.If, cst.While)) and any(name in names_read(h) for h in header):
            found.append(stmt)
        found += _statements_reading(name, inner)
    return found


def _names_written_outside(root: cst.CSTNode, excluded: set[int]) -> set[str]:
    found: set[str] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in excluded or (isinstance(n, (cst.FunctionDef, cst.ClassDef)) and n is not root):
            continue
        if isinstance(n, (cst.SimpleStatementLine, cst.For, cst.With)):
            found |= names_written(n) if isinstance(n, cst.SimpleStatementLine) else set()
            if isinstance(n, cst.For):
                found |= names_bound_by(n.target)
            if isinstance(n, cst.With):
                found |= {a.name.value for a in (i.asname for i in n.items) if a is not None and isinstance(a.name, cst.Name)}
        stack.extend(children(n))
    return found


def _names_read_outside(root: cst.CSTNode, excluded: set[int]) -> set[str]:
    found: set[str] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in excluded:
            continue
        if isinstance(n, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) and not isinstance(
            n, (cst.For, cst.While, cst.If, cst.With, cst.Try, cst.FunctionDef, cst.ClassDef)
        ):
            found |= names_read(n)
            continue
        if isinstance(n, (cst.FunctionDef, cst.ClassDef)) and n is not root:
            # another function sees this scope's names only where it does not bind them itself
            found |= names_read(n.body) - names_written(n.body)
            continue
        if isinstance(n, (cst.For, cst.While, cst.If, cst.With)):
            header = n.iter if isinstance(n, cst.For) else n.test if isinstance(n, (cst.While, cst.If)) else None
            if header is not None:
                found |= names_read(header)
            if isinstance(n, cst.With):
                for item in n.items:
                    found |= names_read(item.item)
        stack.extend(children(n))
    return found


def is_shape_value(name: str, body) -> bool:
    """`n = x.size(0)`: fixed while shapes are fixed, so capture may freeze it."""
    values = [
        v
        for s in body
        for n in walk(s)
        if isinstance(n, cst.Assign)
        for t in n.targets
        if isinstance(t.target, cst.Name) and t.target.value == name
        for v in [n.value]
    ]
    return bool(values) and all(
        any(
            (isinstance(n, cst.Attribute) and n.attr.value == "shape")
            or (isinstance(n, cst.Call) and is_shape_read(n) and method_call(n) is not None)
            or (isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == "len")
            for n in walk(v)
        )
        for v in values
    )


def _only_in_keys(name: str, plan: Plan, body) -> bool:
    for i in plan.graph:
        stmt = body[i]
        if i in plan.keys:  # the tests are the graph's key: what the branches read is in the step
            reads = set().union(*(names_read(s) for branch in if_chain(stmt).branches for s in branch))
            if name in reads:
                return False
        elif name in names_read(stmt):
            return False
    return True


def _in_source_order(names, order: list[str]) -> list[str]:
    """`names` in the order `order` (the step's names as its code writes them) first holds them."""
    first: dict[str, int] = {}
    for name in order:
        if name in names and name not in first:
            first[name] = len(first)
    return sorted(names, key=lambda n: first.get(n, len(first)))


_HOST_READ_CHAIN = {"item", "tolist", "detach", "cpu", "numpy", "float", "double"}


def _kept_in_loop(name: str, body, plan: Plan) -> bool:
    """An output read after the step only through `.item()`, `float()` or formatting needs no copy;
    anything that keeps the tensor (a list, a best-so-far, the next iteration) does, since the next
    replay overwrites it."""
    eager = [(body[i], None) for i in range(len(body)) if i not in plan.graph] + [(body[i], h.replaced) for i, h in plan.hoisted.items()]
    return any(not ok for stmt, replaced in eager for ok, _ in _uses(stmt, name, replaced))


def _uses(stmt: cst.CSTNode, name: str, replaced: dict[int, str] | None = None):
    """(whether only read on the host, the node) for each use of `name`; `replaced`: expressions (by id)
    read as a name instead (the host half of a statement split by the planner)."""

    def visit(n, parents):
        if replaced and id(n) in replaced:
            if replaced[id(n)] == name:
                yield _is_host_read_use(parents), n
            return
        if isinstance(n, cst.Name) and n.value == name:
            yield _is_host_read_use(parents), n
            return
        if isinstance(n, (cst.FunctionDef, cst.ClassDef)):
            return
        for c in children(n):
            yield from visit(c, parents + (n,))

    yield from visit(stmt, ())


def _is_host_read_use(parents) -> bool:
    for p in reversed(parents):
        if isinstance(p, cst.Attribute):
            if p.attr.value not in _HOST_READ_CHAIN:
                return False
            if p.attr.value in ("item", "tolist", "numpy"):
                return True
            continue
        if isinstance(p, cst.Call):
            if isinstance(p.func, cst.Name) and p.func.value in ("float", "int", "print", "str"):
                return True
            continue
        if isinstance(p, (cst.FormattedStringExpression, cst.Arg)):
            return isinstance(p, cst.FormattedStringExpression)
        return False
    return False
