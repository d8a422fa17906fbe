"""Applies plans to the module: step functions, the replay call, graphed modules (partial capture),
and the import of the runtime helpers."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from graphify.analysis.names import code_text, dotted
from graphify.plan import PartialPlan, Plan
from graphify.analysis.step_body import step_statements
from graphify.plan.base import if_chain
from graphify.rewrite.deferred import DEFERRED_READS, Deferral, deferred_run, reads_object, with_flush
from graphify.rewrite.splits import drawn_value, hoisted_halves, regroup, split_if
from graphify.rewrite.staging import stage_call, staged_copies

CAPTURED_STEP, GRAPHED_MODULE, DDP_BUILDER = "CapturedStep", "GraphedModule", "build_on_capture_stream"


@dataclass
class Emission:
    plan: Plan | PartialPlan
    step_name: str  # the step function, or for a partial plan the graphed module
    anchor: cst.CSTNode  # statement before which the step function (or graphed module) is defined
    model: str | None = None  # for a partial plan: the model this emission graphs
    deferral: Deferral | None = None  # --defer-host-reads: the statements after the replay run one step later


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment(f"# graphify: {text}"))


def _with_kwarg(call: cst.Call, name: str, value: str) -> cst.Call:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return call.with_changes(args=[a.with_changes(value=cst.parse_expression(value)) if a is arg else a for a in call.args])
    args = list(call.args)
    if args and args[-1].comma is cst.MaybeSentinel.DEFAULT:
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    args.append(
        cst.Arg(
            keyword=cst.Name(name),
            value=cst.parse_expression(value),
            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
        )
    )
    return call.with_changes(args=args)


def _moved_after(plan: Plan, stmts: list[cst.BaseStatement]) -> list[tuple[int, cst.BaseStatement]]:
    """What runs eagerly after the replay, in source order: statements moved after the step, the host
    half of statements split by the planner, and the host statements of keyed branches."""
    moved = []
    for i in sorted(plan.after + plan.tail + list(plan.split_ifs) + list(plan.hoisted)):
        if i in plan.hoisted:
            moved.append((i, hoisted_halves(plan.statements[i], plan.hoisted[i])[1]))
        elif i in plan.split_ifs:  # the branches' host statements, under the same tests
            moved.append((i, split_if(stmts[i], plan.split_ifs[i])[1]))
        else:
            moved.append((i, stmts[i]))
    return moved


def after_replay(plan: Plan, stmts: list[cst.BaseStatement]) -> list[tuple[int, cst.BaseStatement]]:
    """Everything that runs after the replay, in order: what _moved_after says, then the statements after the step."""
    return _moved_after(plan, stmts) + list(enumerate(stmts))[plan.last + 1 :]


def _clones(plan: Plan, step_name: str) -> list[cst.BaseStatement]:
    """Outputs kept beyond this step, copied: the next replay overwrites the graph's own."""
    if not plan.clones:
        return []
    kept = ", ".join(plan.clones)  # in one call: outputs that are views of one another stay so
    copied = f"{kept} = {step_name}.copy(({kept}))" if len(plan.clones) > 1 else f"{kept} = {step_name}.copy({kept})"
    return [
        cst.parse_statement(copied).with_changes(
            leading_lines=[_comment("copy outputs kept beyond this step: the next replay overwrites them")]
        )
    ]


def _draw_statement(plan: Plan, key: int, step_name: str) -> cst.BaseStatement:
    """`name = expr`; for a batch fetched in each pass of a micro-step loop, `name = step.fetch(lambda:
    expr, k)`: the runtime fetches in pass order while the step runs eagerly, all k before a replay."""
    name, expr = plan.draws[key]
    code = code_text(expr)
    if key in plan.draw_repeats:
        code = f"{step_name}.fetch(lambda: {code}, {code_text(plan.draw_repeats[key][0])})"
    return cst.parse_statement(f"{name} = {code}")


def _draws(plan: Plan, step_name: str) -> list[cst.BaseStatement]:
    """What the step takes from the host, taken before the call in the order the source takes it."""
    draws = [_draw_statement(plan, key, step_name) for key in plan.draws]
    if draws:
        why = (
            "batches the micro-steps fetch: in pass order while the step runs eagerly, all before a replay"
            if plan.draw_repeats
            else "what the step takes from the host (batches, random draws), taken before it in the same order"
        )
        draws[0] = draws[0].with_changes(leading_lines=[_comment(why)])
    return draws


class Rewriter(cst.CSTTransformer):
    def __init__(self, emissions: list[Emission], helper_names: dict[str, str], header: list[cst.BaseStatement]) -> None:
        """helper_names: runtime class name -> its name in this file; header: the pasted runtime (--runtime
        inline), placed after the file's imports (an import of it is added after: bundle.with_runtime_imports)."""
        self.helper_name = helper_names.get(CAPTURED_STEP, CAPTURED_STEP)
        self.reads_class = helper_names.get(DEFERRED_READS, DEFERRED_READS)
        self.header = header
        self.by_loop = {id(e.plan.loop.node): e for e in emissions if isinstance(e.plan, Plan)}
        self.call_edits: dict[int, tuple[str, str]] = {}
        self.device_factories = {k: v for e in emissions if isinstance(e.plan, Plan) for k, v in e.plan.device_factories.items()}
        self.ddp_builds = {k for e in emissions if isinstance(e.plan, Plan) for k in e.plan.ddp_builds}
        self.ddp_builder = helper_names.get(DDP_BUILDER, DDP_BUILDER)
        # expressions of a step evaluated before its call: the step reads their input instead
        self.drawn = {k: drawn_value(e.plan, k) for e in emissions if isinstance(e.plan, Plan) for k in e.plan.draws}
        self.renames: dict[int, str] = {}  # model call -> the graphed module it now calls
        self.passed: dict[int, str] = {}  # a model handed to a helper that calls it -> the graphed module
        self.defs: dict[int, list[cst.BaseStatement]] = {}
        self.staged: dict[int, str] = {}  # a batch's device copy outside the step -> the step that stages it
        for e in emissions:
            if isinstance(e.plan, PartialPlan):
                self._graph_module(e, helper_names[GRAPHED_MODULE])
                continue
            for call in e.plan.zero_grads:
                self.call_edits[id(call)] = ("set_to_none", "False")
            self.staged.update(staged_copies(e.plan, e.step_name))

    def _graph_module(self, e: Emission, class_name: str) -> None:
        plan = e.plan
        for call in plan.model_calls:
            if dotted(call.func) == e.model:
                self.renames[id(call)] = e.step_name
        for passed in plan.model_passes:
            if dotted(passed) == e.model:
                self.passed[id(passed)] = e.step_name
        made = cst.parse_statement(f"{e.step_name} = {class_name}({e.model})").with_changes(
            leading_lines=[
                cst.EmptyLine(indent=False),
                _comment(
                    f"the whole step cannot be captured ({', '.join(plan.reasons)}): {e.model}'s forward and backward replay from CUDA graphs"
                ),
            ]
        )
        self.defs.setdefault(id(e.anchor), []).append(made)

    # ---- calls edited in place ---------------------------------------------------------------

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return cst.Name(self.passed[id(original)]) if id(original) in self.passed else updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        return cst.Name(self.passed[id(original)]) if id(original) in self.passed else updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if id(original) in self.drawn:
            return self.drawn[id(original)]
        if id(original) in self.renames:
            return updated.with_changes(func=cst.Name(self.renames[id(original)]))
        if id(original) in self.device_factories:  # `torch.zeros(n).to(device)` -> `torch.zeros(n, device=device)`
            return _with_kwarg(updated.func.value, "device", self.device_factories[id(original)])
        if id(original) in self.staged:
            return stage_call(updated, self.staged[id(original)])
        if id(original) in self.ddp_builds:  # `DDP(model, ...)` -> `build_on_capture_stream(DDP, model, ...)`
            first = cst.Arg(value=updated.func, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return updated.with_changes(func=cst.Name(self.ddp_builder), args=[first, *updated.args])
        edit = self.call_edits.get(id(original))
        return _with_kwarg(updated, *edit) if edit else updated

    # ---- loops ----------------------------------------------------------------------------------

    def leave_For(self, original, updated):
        return self._loop(original, updated)

    def leave_While(self, original, updated):
        return self._loop(original, updated)

    def _loop(self, original, updated):
        emission = self.by_loop.get(id(original))
        if emission is None:
            return updated
        plan = emission.plan
        step_body = step_statements(updated.body.body)
        stmts = step_body.statements
        self._define_step(emission, step_body)
        key = ""
        if plan.keys:
            tests = list(dict.fromkeys(code_text(test) for i in plan.keys for test in if_chain(stmts[i]).tests))
            key = f", key=({', '.join(tests)},)"
        call = f"{emission.step_name}({', '.join(plan.inputs)}{key})"
        if plan.outputs:
            call = f"{', '.join(plan.outputs)} = {call}"
        call_stmt = cst.parse_statement(call).with_changes(
            leading_lines=[_comment("replay the captured step (warmup and capture on first calls)")]
        )
        before = [(i, s) for i, s in enumerate(stmts[: plan.first]) if i not in plan.pulled_in] + [(i, stmts[i]) for i in plan.before]
        rest = list(enumerate(stmts))[plan.last + 1 :]
        body = regroup(step_body, before) + _draws(plan, emission.step_name) + [call_stmt] + _clones(plan, emission.step_name)
        deferral = emission.deferral
        if deferral is None:
            body += regroup(step_body, _moved_after(plan, stmts)) + regroup(step_body, rest)
            return updated.with_changes(body=updated.body.with_changes(body=body))
        after = after_replay(plan, stmts)
        deferred = regroup(step_body, after[deferral.first :])
        body += regroup(step_body, after[: deferral.first]) + [deferred_run(deferral, deferred, flush=False)]
        return with_flush(updated.with_changes(body=updated.body.with_changes(body=body)), deferral, deferred)

    def _define_step(self, emission: Emission, step_body) -> None:
        """`def train_step(inputs): <captured statements>; return outputs` and its wrapping, placed before
        the loop (or the enclosing loop the step is defined outside of)."""
        plan, stmts = emission.plan, step_body.statements
        graph_body = regroup(step_body, [(i, self._captured(plan, i, stmts[i])) for i in plan.graph])
        graph_body[0] = graph_body[0].with_changes(leading_lines=[line for line in graph_body[0].leading_lines if line.comment])
        if plan.outputs:
            graph_body.append(cst.parse_statement(f"return {', '.join(plan.outputs)}"))
        step_def = cst.parse_statement(f"def {emission.step_name}({', '.join(plan.inputs)}):\n    pass\n")
        step_def = step_def.with_changes(
            body=step_def.body.with_changes(body=graph_body),
            leading_lines=[
                cst.EmptyLine(indent=False),
                _comment(f"one {'training' if plan.kind == 'train' else 'inference'} step of the loop below, replayed from a CUDA graph"),
            ],
        )
        device = f", device={plan.device}" if plan.device is not None else ""
        wrap = cst.parse_statement(f"{emission.step_name} = {self.helper_name}({emission.step_name}{device})")
        made = [step_def, wrap] + ([reads_object(emission.deferral, self.reads_class)] if emission.deferral else [])
        self.defs.setdefault(id(emission.anchor), []).extend(made)

    @staticmethod
    def _captured(plan: Plan, index: int, stmt: cst.BaseStatement) -> cst.BaseStatement:
        """What the step function runs of a statement: a split statement's captured half (built from the
        source's statement, which the plan's description names), a keyed `if` without its host statements."""
        if index in plan.hoisted:
            return hoisted_halves(plan.statements[index], plan.hoisted[index])[0]
        return split_if(stmt, plan.split_ifs[index])[0] if index in plan.split_ifs else stmt

    # ---- where step functions and the helper go ----------------------------------------------------

    def _insert_defs(self, original_children, updated_children):
        out = []
        for orig, upd in zip(original_children, updated_children):
            out.extend(self.defs.pop(id(orig), []))
            out.append(upd)
        return out

    def leave_IndentedBlock(self, original, updated):
        if any(id(c) in self.defs for c in original.body):
            return updated.with_changes(body=self._insert_defs(original.body, updated.body))
        return updated

    def leave_Module(self, original, updated):
        body = list(updated.body)
        if any(id(c) in self.defs for c in original.body):
            body = self._insert_defs(original.body, body)
        at = _after_imports(body)
        body[at:at] = self.header
        return updated.with_changes(body=body)


def _after_imports(body) -> int:
    """Index after the module docstring and the leading imports."""
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) or (isinstance(s, cst.Expr) and isinstance(s.value, cst.SimpleString) and i == 0)
            for s in stmt.body
        ):
            at = i + 1
        elif isinstance(stmt, cst.Try) and all(
            isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)
            for s in stmt.body.body
        ):
            at = i + 1
        else:
            break
    return at
