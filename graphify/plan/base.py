"""What every plan shares: the Plan type, and small facts about statements of the loop body."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from graphify.analysis.checker import kwarg
from graphify.analysis.calls import method_call
from graphify.analysis.region import Loop
from graphify.analysis.step_body import StepBody, is_mode_block, step_statements
from graphify.analysis.names import code_text, dotted
from graphify.analysis.statements import (
    names_read,
    names_written,
    walk,
)
from graphify.analysis.values import Env
from graphify.analysis.vocabulary import PURE_BUILTINS, SCALER, SCHEDULER
from graphify.model import FixKind

# The planner acts on a pattern rule's findings by its fix descriptor (Rule.fix.kind), never by its code:
# findings fixed where they stand are no breakers of the step; a tensor built from host data in the step
# (DRAWN) and a host tensor copied to the device there (ON_DEVICE) are drawn before the call (draws.py);
# the copy of a host factory's tensor gets `device=` instead (Plan.device_factories).
FIXED_IN_PLACE = FixKind.IN_PLACE
SHAPE_METHODS = {"size", "dim", "numel"}


@dataclass
class Hoist:
    """A statement of the step split in two (`total += model(x).sum().item()`): its device expressions
    computed in the graph into fresh names (`total_tensor = model(x).sum()`), and the statement run after
    the replay reading those names instead (`total += total_tensor.item()`), each half inside the mode
    blocks the statement stood in. The rewrite builds both halves (rewrite/splits.py)."""

    expressions: list[cst.BaseExpression]  # the source's, in the order the captured half assigns them
    names: list[str]

    @property
    def replaced(self) -> dict[int, str]:
        """id of each expression -> the name the host half reads in its place."""
        return {id(e): name for e, name in zip(self.expressions, self.names)}

    def captured_roots(self, stmt: cst.BaseStatement) -> list[cst.CSTNode]:
        """What the captured half of `stmt` runs, in order: the items of the mode blocks around it, its expressions."""
        return [*mode_items(stmt), *self.expressions]

    def captured_reads(self, stmt: cst.BaseStatement) -> set[str]:
        return set().union(*(names_read(item.item) for item in mode_items(stmt)), *(names_read(e) for e in self.expressions))

    def captured_names_in_order(self, stmt: cst.BaseStatement) -> list[str]:
        """The names the captured half holds, in the order its code writes them (the fresh names after the items)."""
        items = [n.value for item in mode_items(stmt) for n in walk(item) if isinstance(n, cst.Name)]
        return items + self.names + [n.value for e in self.expressions for n in walk(e) if isinstance(n, cst.Name)]


def mode_items(stmt: cst.BaseStatement) -> list[cst.WithItem]:
    """The items of the mode blocks, one inside the other, that hold `stmt`'s one statement (none if it is no mode block)."""
    items = []
    while is_mode_block(stmt) and len(stmt.body.body) == 1:
        items += stmt.items
        stmt = stmt.body.body[0]
    return items


def inside_mode_blocks(stmt: cst.BaseStatement) -> cst.BaseStatement:
    """The statement the single-statement mode blocks around it hold (`stmt` itself if none)."""
    while is_mode_block(stmt) and len(stmt.body.body) == 1:
        stmt = stmt.body.body[0]
    return stmt


@dataclass
class Plan:
    loop: Loop
    kind: str
    first: int  # body index of the first statement of the step
    last: int  # body index of the last statement of the step (inclusive)
    graph: list[int] = field(default_factory=list)  # body indexes captured
    before: list[int] = field(default_factory=list)  # step statements moved before the call
    after: list[int] = field(default_factory=list)  # step statements moved after the call
    # keyed if -> per branch (the `if`'s, each `elif`'s, the `else`'s), the indexes of its statements (as
    # step_statements opens them) that run after the replay, under the same tests (rewrite/splits.split_if)
    split_ifs: dict[int, list[set[int]]] = field(default_factory=dict)
    tail: list[int] = field(default_factory=list)  # eager statements after the call (GradScaler)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    clones: list[str] = field(default_factory=list)
    optimizers: list[str] = field(default_factory=list)  # the optimizers the step steps, as code in the loop's scope
    keys: list[int] = field(default_factory=list)  # body indexes of keyed ifs
    device: str | None = None  # where host inputs go (code in the loop's scope), for `.to(device)` inside the step
    zero_grads: list[cst.Call] = field(default_factory=list)
    # `torch.zeros(...).to(device)` in the step -> the `device=` its factory takes instead (by id of the copy)
    device_factories: dict[int, str] = field(default_factory=dict)
    # DistributedDataParallel(...) calls of this file that build the step's model: built on the capture stream
    ddp_builds: set[int] = field(default_factory=set)
    # `correct += (model(x).argmax(1) == y).sum().item()`: the tensor is computed in the graph,
    # the host read runs after the replay. index -> what is split off (Hoist)
    hoisted: dict[int, Hoist] = field(default_factory=dict)
    hoisted_reads: set[int] = field(default_factory=set)  # ids of the host-read calls moved out
    pulled_in: list[int] = field(default_factory=list)  # statements before `first` moved into the step
    # `torch.randn(b, n).to(device)` in a captured statement -> (input name, the expression), evaluated
    # before the call in source order (draws.py); keyed by the expression's id
    draws: dict[int, tuple[str, cst.BaseExpression]] = field(default_factory=dict)
    # draws made in each pass of a micro-step loop in the step: key -> (the loop's count, its index name)
    draw_repeats: dict[int, tuple[cst.BaseExpression, str]] = field(default_factory=dict)
    fetches: list[cst.Call] = field(default_factory=list)  # the `next(...)` calls among the drawn expressions
    # breakers the rewrite cannot remove, left eager where they stand outside the step (Finding)
    eager: list = field(default_factory=list)
    # per-step device copies made outside the step, where they stand (Finding): the rewrite stages them
    copies_outside: list = field(default_factory=list)
    # the loop body as planned (StepBody.statements), which the indexes above count, and where each comes from
    statements: list[cst.BaseStatement] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)


@dataclass
class IfChain:
    """`if a: ... elif b: ... else: ...`: the tests in order, and each branch's statements (the `else`'s last)."""

    tests: list[cst.BaseExpression]
    branches: list[list[cst.BaseStatement]]
    has_else: bool
    one_line: bool  # some branch is written on the `if`'s line


def if_chain(stmt: cst.If) -> IfChain:
    chain, node = IfChain([], [], False, False), stmt
    while True:
        chain.tests.append(node.test)
        chain.branches.append(list(node.body.body) if isinstance(node.body, cst.IndentedBlock) else [])
        chain.one_line |= not isinstance(node.body, cst.IndentedBlock)
        if isinstance(node.orelse, cst.If):
            node = node.orelse
            continue
        if isinstance(node.orelse, cst.Else):
            chain.has_else = True
            chain.branches.append(list(node.orelse.body.body) if isinstance(node.orelse.body, cst.IndentedBlock) else [])
            chain.one_line |= not isinstance(node.orelse.body, cst.IndentedBlock)
        return chain


def is_pure_binding(stmt: cst.CSTNode) -> bool:
    """`targets = {"target": batch["target"]}`: names bound to containers, items or attributes of values,
    with no call: it runs the same at capture as at every replay."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    if all(isinstance(s, cst.Expr) and isinstance(s.value, (cst.SimpleString, cst.ConcatenatedString)) for s in stmt.body):
        return True  # a string standing as a comment
    if not all(isinstance(s, cst.Assign) for s in stmt.body):
        return False
    return not any(isinstance(n, (cst.Call, cst.Await, cst.Yield)) for s in stmt.body for n in walk(s.value))


def body_of(loop: Loop) -> list[cst.BaseStatement]:
    body = loop.node.body
    return list(body.body) if isinstance(body, cst.IndentedBlock) else []


def branch_statements(stmt: cst.If) -> list[StepBody]:
    """Each branch of a keyed `if` chain as the planner reads it: its mode blocks opened."""
    return [step_statements(branch, guards=False) for branch in if_chain(stmt).branches]


def kept_roots(stmt: cst.If, moved: list[set[int]]) -> list[cst.CSTNode]:
    """What the captured half of a split keyed `if` runs, in its order (the rewrite builds that half:
    rewrite/splits.split_if): the tests of the branches it keeps (up to the last that keeps a statement)
    and the statements each keeps, those of a mode block after its items (once for neighbours)."""
    tests, branches = if_chain(stmt).tests, branch_statements(stmt)
    kept = [[k for k in range(len(b.statements)) if k not in (moved[i] if i < len(moved) else set())] for i, b in enumerate(branches)]
    last = max((i for i, k in enumerate(kept) if k), default=0)
    roots: list[cst.CSTNode] = []
    for i in range(last + 1):
        roots += tests[i : i + 1]
        block = None
        for k in kept[i]:
            opened = branches[i].statements[k]
            if branches[i].blocks[k] is None:
                roots.append(opened)
                block = None
                continue
            if branches[i].blocks[k] is not block:
                roots += opened.items
            roots += opened.body.body
            block = branches[i].blocks[k]
    return roots


def moved_statements(stmt: cst.If, moved: list[set[int]]) -> list[cst.BaseStatement]:
    """The source's statements of a keyed `if` that run after the replay (inside a mode block: its own)."""
    found = []
    for branch, indexes in zip(branch_statements(stmt), moved):
        for k in sorted(indexes):
            opened = branch.statements[k]
            found.extend(opened.body.body if branch.blocks[k] is not None else [opened])
    return found


def source_of(node: cst.CSTNode | None) -> cst.CSTNode | None:
    """The source's statement for a statement of a mode block as the planner opens it (a copy of the block
    around it, which has no place in the file): where a reason about it is told."""
    if is_mode_block(node) and len(node.body.body) == 1:
        return node.body.body[0]
    return node


def rebound_in_loop(loop: Loop) -> set[str]:
    """Names bound anywhere in the outermost loop (of the same function) around the step's loop:
    the step function is defined before it, so each of them may differ from one step to the next."""
    outer = loop.node
    for a in reversed(loop.ancestors):
        if isinstance(a, (cst.FunctionDef, cst.ClassDef)):
            break
        if isinstance(a, (cst.For, cst.While)):
            outer = a
    return names_written(outer)


def is_scaler_call(node: cst.CSTNode, env: Env) -> bool:
    m = method_call(node)
    return m is not None and m[1] in ("step", "update", "unscale_") and env.kind_of(m[0]) == SCALER


def is_zero_grad(node: cst.CSTNode) -> bool:
    m = method_call(node)
    return m is not None and m[1] == "zero_grad"


def is_autocast(item: cst.WithItem, env: Env) -> bool:
    return isinstance(item.item, cst.Call) and (env.qualify(item.item.func) or "").endswith("autocast")


def sets_lr(stmt: cst.CSTNode, env: Env) -> bool:
    """Whether it sets the optimizer's learning rate, by hand (`g["lr"] = lr`) or by an LR scheduler's step
    without a metric (`scheduler.step()`): only the optimizer's step reads it, so it may run before the
    whole step even where it stands between the backward and the optimizer's step."""
    for n in walk(stmt):
        if isinstance(n, cst.SimpleString) and n.value.strip("'\"") == "lr":
            return True
        m = method_call(n) if isinstance(n, cst.Call) else None
        if m is not None and m[1] == "step" and not n.args and env.kind_of(m[0]) == SCHEDULER:
            return True
    return False


def has_side_effects(stmt: cst.CSTNode) -> bool:
    """Whether it calls anything but shape reads and builtins that change nothing (`len`, `type`, `tuple`)."""
    return any(
        isinstance(n, cst.Call) and not is_shape_read(n) and not (isinstance(n.func, cst.Name) and n.func.value in PURE_BUILTINS)
        for n in walk(stmt)
    )


def is_shape_read(call: cst.Call) -> bool:
    m = method_call(call)
    return (m is not None and m[1] in SHAPE_METHODS) or (
        isinstance(call.func, cst.Name) and call.func.value in ("len", "int", "float", "min", "max")
    )


def line(plan: Plan, node: cst.CSTNode) -> int:
    try:
        return plan.loop.module.position(node).start.line
    except KeyError:
        return plan.loop.module.position(plan.loop.node).start.line


def body_nodes_of(plan: Plan, node: cst.CSTNode) -> list[cst.CSTNode]:
    """The node itself when it is in the loop body, else the body's calls that lead to it."""
    region = plan.loop.region
    site = next((st for n, st in region.nodes if n is node), None)
    if site is None or site.block is region.body_block:
        return [node]
    return region.body_calls_of(site) or [node]


def device_in_loop_scope(plan: Plan, call: cst.Call) -> str | None:
    """The device a `.to(device)` inside the step names, as code valid in the loop's scope."""
    region = plan.loop.region
    site = next((st for n, st in region.nodes if n is call), None)
    if site is None or not isinstance(call.func, cst.Attribute):
        return None
    if call.func.attr.value == "cuda":
        return '"cuda"'
    expr = kwarg(call, "device") or (call.args[0].value if call.args and call.args[0].keyword is None else None)
    return in_loop_scope(plan, expr, site.block)


def _same_global(plan: Plan, name: str, helper: Env) -> bool:
    """`device` read in a helper of the loop's module that does not bind it: the module's `device`, which
    the loop's scope reads too unless its function binds a `device` of its own."""
    loop_scope = plan.loop.func.scope if plan.loop.func.node is not None else None
    return (
        "." not in name
        and helper.module_scope is plan.loop.module.scope
        and name not in helper.scope.values
        and name in plan.loop.module.scope.values
        and (loop_scope is None or name not in loop_scope.values)
    )


def in_loop_scope(plan: Plan, expr: cst.BaseExpression | None, block) -> str | None:
    """`expr`, written in a function the step calls, as code valid in the loop's scope: parameters are
    traced back to their call-site arguments, `self.x` to `obj.x` for `obj.method()` (code, no longer a
    node of the source: `expr` None, `name` its dotted name if it has one)."""
    region = plan.loop.region
    code, name = (None, None) if expr is None else (code_text(expr), dotted(expr))
    while code is not None and block is not region.body_block:
        if isinstance(expr, cst.SimpleString):
            return code
        if name is None or block.call is None:
            return None
        if name in block.env.bound:
            expr = block.env.bound[name][1]
            code, name = code_text(expr), dotted(expr)
        elif name.startswith("self.") and isinstance(block.call.func, cst.Attribute):
            owner = block.call.func.value
            if not (isinstance(owner, cst.Name) and owner.value == "self"):
                owner_name = dotted(owner)
                expr, code = None, f"{code_text(owner)}.{name[5:]}"
                name = None if owner_name is None else f"{owner_name}.{name[5:]}"
        elif _same_global(plan, name, block.env):
            return code
        else:
            return None
        block = block.parent
    return code


def fresh_name(base: str, taken: set[str]) -> str:
    """A name the rewrite introduces, chosen so that it cannot collide with the user's: `base`, or `base_2`..."""
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name
