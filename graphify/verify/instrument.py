"""A probe after the step of one loop, in the original and (through the rewriter) in the rewrite.

The probe goes into the ORIGINAL source, right after the last top-level statement of the loop body
that holds the backward pass or the optimizer step (for inference loops: the model call). The
rewrite is then made from the instrumented source, so both versions call the probe at the same
point of each step with the same expressions: the rewriter keeps host-only statements that follow
the step eager, after the replay, where they read the step's static outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from graphify.analysis.checker import Checker
from graphify.analysis.calls import is_backward, is_model_call, is_step_op, method_call
from graphify.analysis.names import code_text, dotted
from graphify.analysis.rewritten import runtime_helper_assignments
from graphify.analysis.program import Program
from graphify.engine import LoopAnalysis, analyze_module
from graphify.analysis.statements import names_read, names_written, walk
from graphify.analysis.tree import descendants
from graphify.analysis.vocabulary import SCHEDULER
from graphify.model import Verdict
from graphify.rewrite import rewrite_source
from graphify.plan import Plan, body_of

PROBE = "__graphify_probe__"
_IMPURE = (cst.Call, cst.NamedExpr, cst.Await, cst.Yield)  # reading the loss again must not run code


class InstrumentError(Exception):
    """Nothing to verify in this file (the message says why)."""


@dataclass
class Instrumented:
    original: str  # the original source with the probe
    rewritten: str  # graphify rewrite of `original`
    line: int  # the probed loop's header line
    kind: str  # "train" | "inference"
    function: str | None
    step_name: str  # the captured step function the rewrite defines
    records_values: bool  # whether the probe records losses (or outputs), not only timing
    reenterable: bool = False  # the loop sits in a function or an outer loop: it may be entered again
    scheduled: bool = False  # the learning rate is scheduled or assigned around the loop
    other_loops: list[tuple[str, int, int]] = field(default_factory=list)  # see timing_marks


def instrument(source: str, path: str, settings=None) -> Instrumented:
    if settings is None:
        from graphify.config import Settings

        settings = Settings()
    result = analyze_module(source, path, settings)
    if result.report.errors:
        raise InstrumentError(result.report.errors[0].message)
    candidates = [a for a in result.loops if a.verdict not in (Verdict.NOT_CAPTURABLE, Verdict.ALREADY_CAPTURED)]
    candidates.sort(key=lambda a: a.loop.kind != "train")  # training loops first, in source order
    why = [f"line {lp.line}: {lp.kind} loop is {lp.verdict.value}" for lp in result.report.loops if lp.verdict == Verdict.NOT_CAPTURABLE]
    for analysis in candidates:
        loop = analysis.loop
        line = loop.module.position(loop.node).start.line
        probe = _probe(analysis)
        if probe is None:
            why.append(f"line {line}: the step is not in the loop body itself")
            continue
        owner, index, text, records = probe
        original, rewrite, outcome = _probed(result, loop.node, owner, index, text, line, path, settings)
        if outcome is not None and outcome.model_only and records and isinstance(analysis.plan, Plan):
            # the probe's read of the loss made the step refuse (a loss bound only under a keyed `if`): the
            # whole step is what the user gets, so compare it on the state alone
            text, records = _state_only(text), False
            original, rewrite, outcome = _probed(result, loop.node, owner, index, text, line, path, settings)
        if rewrite.errors or outcome is None or not outcome.rewritten:
            reasons = [e.message for e in rewrite.errors] or (outcome.reasons if outcome else ["not rewritten"])
            why.append(f"line {line}: {'; '.join(reasons)}")
            continue
        # a partial rewrite only renames the model's calls (in closures too): the probe stays where it was put
        if not outcome.model_only and not probe_follows_call(rewrite.code, outcome.step_name):
            raise InstrumentError(f"line {line}: the rewrite does not keep the probe after the captured step; cannot compare")
        others = _other_loops(result, analysis)
        return Instrumented(
            original, rewrite.code, line, loop.kind, loop.func.qualname, outcome.step_name, records, *_context(analysis), other_loops=others
        )
    detail = f" ({'; '.join(why)})" if why else ""
    raise InstrumentError(f"graphify rewrite changes no loop of this file, so there is nothing to verify{detail}")


def _probed(result, loop: cst.CSTNode, owner: cst.CSTNode, index: int, text: str, line: int, path: str, settings):
    """The original with the probe, its rewrite, and what the rewrite did with the probed loop."""
    original = result.module.tree.visit(_Insert(loop, owner, index, text)).code
    rewrite = rewrite_source(original, path, settings)
    outcome = next((o for o in rewrite.outcomes if o.line == line + 1), None)  # the entry marker is one line above
    return original, rewrite, outcome


def _state_only(text: str) -> str:
    """The probe call without the loss or outputs it records: it compares parameters and state alone."""
    call = cst.parse_expression(text.split("\n")[0])
    return code_text(call.with_changes(args=[call.args[0].with_changes(value=cst.Name("None")), *call.args[1:]]))


def instrument_given(source: str, path: str, rewritten: str, settings=None) -> Instrumented:
    """Probe a rewrite made elsewhere (edited by hand, or by an older graphify) beside its original: the
    same probe goes after the same loop's step in both. In the rewrite, that loop is the one with the same
    header, and the probe follows its last statement that calls a runtime helper (or, failing that, the
    statement the original's probe follows)."""
    if settings is None:
        from graphify.config import Settings

        settings = Settings()
    result = analyze_module(source, path, settings)
    if result.report.errors:
        raise InstrumentError(result.report.errors[0].message)
    try:
        given = cst.parse_module(rewritten)
    except cst.ParserSyntaxError as exc:
        raise InstrumentError(f"the given rewrite does not parse: {exc.message}") from None
    for analysis in sorted(result.loops, key=lambda a: a.loop.kind != "train"):
        probe = _probe(analysis)
        if probe is None:
            continue
        owner, index, text, records = probe
        loop = analysis.loop
        header = _header(loop.node)
        anchor = code_text(_block(owner)[index].with_changes(leading_lines=[])).strip()
        target = next((n for n in descendants(given) if isinstance(n, (cst.For, cst.While)) and _header(n) == header), None)
        if owner is not loop.node and target is not None:  # the step runs under an `if` of the loop: the same `if` there
            target_owner = next((n for n in descendants(target) if isinstance(n, cst.If) and _header(n) == _header(owner)), None)
        else:
            target_owner = target
        if target_owner is None:
            continue
        stmts = _block(target_owner)
        helpers = [name for name, _ in runtime_helper_assignments(Program().add(path, rewritten, given))]
        after = [i for i, st in enumerate(stmts) if code_text(st.with_changes(leading_lines=[])).strip() == anchor]
        after = after or [i for i, st in enumerate(stmts) if any(_calls(st, name) for name in helpers)]
        if not after:
            continue
        line = loop.module.position(loop.node).start.line
        call = cst.parse_expression(text.split("\n")[0])
        available = set().union(*(names_written(st) for st in stmts[: after[-1] + 1]))
        if isinstance(target, cst.For):
            available |= names_written(cst.Assign([cst.AssignTarget(target.target)], cst.Name("_")))
        if not names_read(call.args[0].value) <= available:  # the rewrite keeps no loss here: compare the state only
            text, records = _state_only(text), False
        original = result.module.tree.visit(_Insert(loop.node, owner, index, text)).code
        step_name = next((name for name in helpers if _calls(stmts[after[-1]], name)), "")
        return Instrumented(
            original,
            given.visit(_Insert(target, target_owner, after[-1], text)).code,
            line,
            loop.kind,
            loop.func.qualname,
            step_name,
            records,
            *_context(analysis),
            other_loops=_other_loops(result, analysis),
        )
    raise InstrumentError("no loop of the original has a counterpart in the given rewrite (the same loop header)")


def _context(analysis: LoopAnalysis) -> tuple[bool, bool]:
    """(the loop may be entered again, the learning rate changes around it): what a run must cover."""
    loop = analysis.loop
    reenterable = loop.func.node is not None or any(isinstance(a, (cst.For, cst.While)) for a in loop.ancestors)
    scope = loop.func.node if loop.func.node is not None else loop.module.tree
    env = loop.region.body_block.env
    scheduled = any(f.rule.category == "lr-scheduler" for f in analysis.all_findings) or any(
        (m := method_call(n)) is not None and m[1] == "step" and env.kind_of(m[0]) == SCHEDULER for n in walk(scope)
    )
    return reenterable, scheduled


def _header(loop: cst.For | cst.While) -> str:
    return code_text(loop.with_changes(leading_lines=[])).split("\n", 1)[0].strip()


def _probe(analysis: LoopAnalysis) -> tuple[cst.CSTNode, int, str, bool] | None:
    """(the loop or the `if` in it whose block gets the probe, index of the statement of that block to
    probe after, probe statement, records values) or None."""
    loop = analysis.loop
    body = body_of(loop)
    env = loop.region.body_block.env
    calls, in_closures = _body_calls(body)
    if loop.kind == "train":
        anchors = [i for i, n in calls if is_step_op(n, env)]
        plan = analysis.plan
        carried = _carried(plan)
        if not anchors and plan is not None and not isinstance(plan, Plan):
            return _probe_after_helper(analysis, body, carried)
        if not anchors and plan is not None:
            # the step runs in a called function: record what the captured call returns
            optimizers = _optimizers(plan.optimizers)
            # names the original binds too: not those the rewrite makes splitting a statement (`total_tensor`)
            bound = set().union(*(names_written(plan.statements[i]) for i in plan.graph))
            outputs = [n for n in plan.outputs if n in bound]
            return loop.node, plan.origins[plan.last], f"{PROBE}({_tuple(outputs) or 'None'}, {optimizers}{carried})", bool(outputs)
        if not anchors:
            return None
        losses = [loss for _, n in calls if is_backward(n, env) and id(n) not in in_closures for loss in [_loss_of(n)] if loss is not None]
        value = _tuple([f"{_code(loss, attr=True)}.item()" for loss in losses])
        optimizers = _distinct(expr for expr, site in Checker(loop).stepped_optimizers if any(n is expr for s in body for n in walk(s)))
        owner, index = loop.node, anchors[-1]
        if not isinstance(plan, Plan):  # a whole step captures its `if` (keyed by the condition); a partial one leaves it in the loop
            owner, index = _step_block(loop.node, index, [n for _, n in calls if is_step_op(n, env)])
        return owner, index, f"{PROBE}({value or 'None'}, {_optimizers([_code(o) for o in optimizers])}{carried})", bool(losses)
    anchors = [i for i, n in calls if is_model_call(n, env)]
    if not anchors:
        return None
    last = body[anchors[-1]]
    output, names = None, []
    if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Assign) and len(last.body[0].targets) == 1:
        target = last.body[0].targets[0].target
        names = target.elements if isinstance(target, (cst.Tuple, cst.List)) else []
        if isinstance(target, cst.Name) or (names and all(isinstance(e.value, cst.Name) for e in names)):
            output = target
    value = _tuple([_code(e.value) for e in names]) if names else _code(output) if output is not None else "None"
    return loop.node, anchors[-1], f"{PROBE}({value}, None)", output is not None


def _probe_after_helper(analysis: LoopAnalysis, body: list[cst.BaseStatement], carried: str) -> tuple | None:
    """A partial capture whose step runs in a helper handed the model (`loss = train(model, data, opt)`):
    the probe goes after the last statement handing the model to a helper that runs the backward (not to
    an evaluation helper after it), and reads the optimizers the helper steps as the loop body names them
    (the arguments bound to the helper's parameters)."""
    region = analysis.loop.region
    backward_calls = {
        id(c) for n, site in region.nodes if isinstance(n, cst.Call) and is_backward(n, site.env) for c in region.body_calls_of(site)
    }
    passes = {id(m) for m in analysis.plan.model_passes}
    handing = [i for i, s in enumerate(body) if any(id(n) in passes for n in walk(s)) and any(id(n) in backward_calls for n in walk(s))]
    if not handing:
        return None
    in_body = {id(n) for s in body for n in walk(s)}
    stepped = []
    for expr, site in Checker(analysis.loop).stepped_optimizers:
        bound = site.env.bound.get(dotted(expr) or "")
        for candidate in (expr, bound[1] if bound else None):
            if candidate is not None and id(candidate) in in_body:
                stepped.append(candidate)
    optimizers = _optimizers([_code(o) for o in _distinct(stepped)])
    return analysis.loop.node, handing[-1], f"{PROBE}(None, {optimizers}{carried})", False


def _step_block(loop: cst.For | cst.While, index: int, step_calls: list[cst.Call]) -> tuple[cst.CSTNode, int]:
    """Where the probe of a partial capture goes: after loop body statement `index`, or, when every step
    call sits in the body of an `if` there (a step taken only on some iterations, `if step > warmup:`),
    inside that `if`, so the probe runs when the step does and never reads a loss the iteration did not
    compute."""
    wanted = {id(c) for c in step_calls}
    owner = loop
    while isinstance((stmt := _block(owner)[index]), cst.If) and isinstance(stmt.body, cst.IndentedBlock):
        if not wanted <= {id(n) for n in walk(stmt.body)}:
            break
        owner, index = stmt, max(j for j, s in enumerate(stmt.body.body) if any(id(n) in wanted for n in walk(s)))
    return owner, index


def _block(owner: cst.CSTNode) -> list[cst.BaseStatement]:
    return list(owner.body.body) if isinstance(owner.body, cst.IndentedBlock) else []


def _body_calls(body: list[cst.BaseStatement]) -> tuple[list[tuple[int, cst.Call]], set[int]]:
    """(index of the body statement, call) for each call the body runs, and the ids of those made in
    closures defined in the body: a closure's calls count at the statements that call it or hand it on
    (`optimizer.step(closure)`), not where it is defined."""
    closures = {s.name.value: s for s in body if isinstance(s, cst.FunctionDef)}
    in_closures = {id(n) for f in closures.values() for n in walk(f) if isinstance(n, cst.Call)}
    found = []
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.FunctionDef):
            continue
        for n in walk(stmt):
            if isinstance(n, cst.Call):
                found.append((i, n))
            elif isinstance(n, cst.Name) and n.value in closures:
                found.extend((i, c) for c in walk(closures[n.value]) if isinstance(c, cst.Call))
    return found, in_closures


def _carried(plan) -> str:
    """`, (h,)`: the step's outputs that the next step reads again (an RNN's hidden state), as the
    probe's third argument, so teacher forcing loads them too; otherwise a rounding difference in
    them would compound from step to step and no step could be compared from identical state."""
    if not isinstance(plan, Plan):  # a partial capture graphs the model alone: no step hands state on
        return ""
    names = [n for n in plan.outputs if n in plan.inputs]
    return f", ({', '.join(names)},)" if names else ""


def _loss_of(call: cst.Call) -> cst.BaseExpression | None:
    """The scalar whose backward this call runs; None when it is not a plain expression (or not a scalar)."""
    m = method_call(call)
    if m is not None and m[1] == "backward":
        if call.args:
            return None  # backward(gradient): not a scalar loss
        loss = m[0]
        inner = method_call(loss)
        if inner is not None and inner[1] == "scale" and len(loss.args) == 1:  # scaler.scale(loss).backward()
            loss = loss.args[0].value
    elif call.args and not any(a.keyword and a.keyword.value == "grad_tensors" for a in call.args):
        loss = call.args[0].value  # manual_backward(loss), torch.autograd.backward(loss)
    else:
        return None
    return None if any(isinstance(n, _IMPURE) for n in walk(loss)) else loss


def _code(expr: cst.BaseExpression, attr: bool = False) -> str:
    text = code_text(expr)
    if attr and not isinstance(expr, (cst.Name, cst.Attribute, cst.Subscript)) and not getattr(expr, "lpar", None):
        return f"({text})"
    return text


def _tuple(items: list[str]) -> str:
    if len(items) <= 1:
        return items[0] if items else ""
    return f"({', '.join(items)})"


def _optimizers(items: list[str]) -> str:
    """Always a tuple: a probe handed the loss and a bare optimizer would read as a step run out of sight (GFY707)."""
    return f"({', '.join(items)}{',' if len(items) == 1 else ''})" if items else "None"


def _distinct(exprs) -> list[cst.BaseExpression]:
    out: list[cst.BaseExpression] = []
    for e in exprs:
        if not any(e.deep_equals(o) for o in out):
            out.append(e)
    return out


class _Insert(cst.CSTTransformer):
    """The probe after statement `index` of the block of `owner` (the loop, or an `if` in it), and
    `__graphify_probe__.enter()` just before the loop, which counts how often the loop is entered."""

    def __init__(self, loop: cst.CSTNode, owner: cst.CSTNode, index: int, text: str) -> None:
        self.loop, self.owner, self.index, self.text = loop, owner, index, text

    def _mark(self, original, updated):
        if not any(c is self.loop for c in original.body):
            return updated
        body = []
        for orig, upd in zip(original.body, updated.body):
            if orig is self.loop:
                body.append(cst.parse_statement(f"{PROBE}.enter()\n"))
            body.append(upd)
        return updated.with_changes(body=body)

    leave_IndentedBlock = _mark
    leave_Module = _mark

    def _leave_owner(self, original, updated):
        if original is not self.owner:
            return updated
        stmts = list(updated.body.body)
        stmts.insert(self.index + 1, cst.parse_statement(self.text))
        return updated.with_changes(body=updated.body.with_changes(body=stmts))

    leave_For = _leave_owner
    leave_While = _leave_owner
    leave_If = _leave_owner


def probe_follows_call(code: str, step_name: str) -> bool:
    """Whether the probe is a statement of the same block as, and after, a call of the captured step."""
    tree = cst.parse_module(code)
    blocks = [n for n in descendants(tree) if isinstance(n, cst.IndentedBlock)]
    found = False
    for block in blocks:
        seen_call = False
        for stmt in block.body:
            if _runs(stmt, step_name):
                seen_call = True
            if isinstance(stmt, cst.SimpleStatementLine) and _calls(stmt, PROBE):
                if not seen_call:
                    return False
                found = True
    return found


def _runs(stmt: cst.CSTNode, name: str) -> bool:
    """The statement calls `name` every time it runs (directly, or in a `with` block: under autocast)."""
    if isinstance(stmt, cst.With) and isinstance(stmt.body, cst.IndentedBlock):
        return any(_runs(s, name) for s in stmt.body.body)
    return _calls(stmt, name)


def _calls(stmt: cst.CSTNode, name: str) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    return any(isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == name for n in walk(stmt))


# ---- marks for the time split (timing.py) --------------------------------------------------------


def _other_loops(result, probed: LoopAnalysis) -> list[tuple[str, int, int]]:
    """(header, occurrence among the file's loops with that header, line) of every other training or
    inference loop of the file: its time is evaluation. Not a loop around the probed one (its time is the
    training's), nor one inside it (it may be part of the step, which the rewrite replays without it)."""
    target = probed.loop.node
    inside = {id(n) for n in descendants(target)}
    wanted = {}
    for analysis in result.loops:
        loop = analysis.loop
        if analysis is probed or loop.module is not result.module or id(loop.node) in inside:
            continue
        if any(n is target for n in descendants(loop.node)):
            continue
        wanted[id(loop.node)] = loop.module.position(loop.node).start.line
    return [(header, k, wanted[id(node)]) for header, k, node in _loops(result.module.tree) if id(node) in wanted]


def _loops(tree: cst.Module) -> list[tuple[str, int, cst.CSTNode]]:
    """(header, occurrence among the loops with that header, loop) of every loop, in source order."""
    found: list[cst.CSTNode] = []

    class Collect(cst.CSTVisitor):
        def visit_For(self, node) -> None:
            found.append(node)

        def visit_While(self, node) -> None:
            found.append(node)

    tree.visit(Collect())
    seen: dict[str, int] = {}
    out = []
    for node in found:
        header = _header(node)
        seen[header] = seen.get(header, -1) + 1
        out.append((header, seen[header], node))
    return out


def _probed_loop(tree: cst.Module) -> cst.CSTNode | None:
    """The innermost loop around the probe's call."""
    found: list[cst.CSTNode] = []
    stack: list[cst.CSTNode] = []

    class Find(cst.CSTVisitor):
        def visit_For(self, node) -> None:
            stack.append(node)

        def leave_For(self, node) -> None:
            stack.pop()

        def visit_While(self, node) -> None:
            stack.append(node)

        def leave_While(self, node) -> None:
            stack.pop()

        def visit_Call(self, node) -> None:
            if isinstance(node.func, cst.Name) and node.func.value == PROBE and stack:
                found.append(stack[-1])

    tree.visit(Find())
    return found[0] if len(found) == 1 else None


def timing_marks(original: str, rewritten: str, others: list[tuple[str, int, int]]) -> tuple[str, str]:
    """Both versions with what the time split needs: `__graphify_probe__.other(LINE)` and `.other_end(LINE)`
    around each other loop (an evaluation loop), and the probed `for` loop's iterable handed through
    `__graphify_probe__.data(...)`, which times its `next()`. Added to the code that runs, after the
    rewrite was made, so the rewrite is the one the user gets; a loop not found alike in both versions
    (by its header and place among the loops with that header, or, for the probed one, around the probe)
    is marked in neither. Code that does not parse is left as it is."""
    try:
        trees = [cst.parse_module(original), cst.parse_module(rewritten)]
    except cst.ParserSyntaxError:
        return original, rewritten
    loops = [{(h, k): n for h, k, n in _loops(tree)} for tree in trees]
    keys = [(h, k, line) for h, k, line in others if all((h, k) in found for found in loops)]
    probed = [_probed_loop(tree) for tree in trees]
    wrap = all(isinstance(p, cst.For) and p.asynchronous is None for p in probed)
    out = []
    for tree, found, loop in zip(trees, loops, probed):
        marks = {id(found[(h, k)]): line for h, k, line in keys}
        out.append(tree.visit(_Marks(marks, loop if wrap else None)).code)
    return out[0], out[1]


class _Marks(cst.CSTTransformer):
    def __init__(self, others: dict[int, int], probed: cst.For | None) -> None:
        self.others, self.probed = others, probed

    def leave_For(self, original, updated):
        if original is not self.probed:
            return updated
        data = cst.Call(cst.Attribute(cst.Name(PROBE), cst.Name("data")), [cst.Arg(updated.iter)])
        return updated.with_changes(iter=data)

    def _block(self, original, updated):
        if not any(id(c) in self.others for c in original.body):
            return updated
        body = []
        for orig, upd in zip(original.body, updated.body):
            line = self.others.get(id(orig))
            if line is not None:
                body.append(cst.parse_statement(f"{PROBE}.other({line})\n"))
            body.append(upd)
            if line is not None:
                body.append(cst.parse_statement(f"{PROBE}.other_end({line})\n"))
        return updated.with_changes(body=body)

    leave_IndentedBlock = _block
    leave_Module = _block
