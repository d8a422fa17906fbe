"""rewrite_source: one file in, its rewrite (and what happened to each loop) out."""

from __future__ import annotations

import sys

from dataclasses import dataclass, field

import libcst as cst

from graphify.engine import TOO_DEEP, analyze_module
from graphify.analysis.names import dotted
from graphify.analysis.statements import names_written, walk
from graphify.files import python_syntax_error
from graphify.model import FileError, Verdict
from graphify.rewrite.bundle import RuntimeChoice, bound_runtime_names, runtime_header, with_runtime_imports
from graphify.rewrite.deferred import DEFERRED_READS, plan_deferral
from graphify.rewrite.emit import CAPTURED_STEP, DDP_BUILDER, GRAPHED_MODULE, Emission, Rewriter, after_replay
from graphify.plan.base import fresh_name
from graphify.plan import PartialPlan
from graphify.plan.dataflow import attribute_targets


@dataclass
class LoopOutcome:
    path: str
    line: int
    kind: str
    function: str | None
    verdict: Verdict
    rewritten: bool
    reasons: list[str] = field(default_factory=list)
    step_name: str | None = None
    model_only: bool = False  # the rewrite graphs the model's forward and backward, not the step
    graphed: list[str] = field(default_factory=list)  # for model_only: the graphed modules, one per model
    partial_refusal: str | None = None  # a training loop left unchanged: why its models are not graphed alone


@dataclass
class RewriteResult:
    path: str
    source: str
    code: str
    outcomes: list[LoopOutcome] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.code != self.source


def rewrite_source(source: str, path: str, settings=None, runtime: RuntimeChoice = RuntimeChoice()) -> RewriteResult:
    """Rewrite every eligible loop of one file, bringing the runtime in as `runtime` says. Never raises
    for bad input; never returns code that does not parse."""
    try:
        return _rewrite_source(source, path, settings, runtime)
    except RecursionError:
        return RewriteResult(path, source, source, errors=[FileError(path, TOO_DEEP)])


def _rewrite_source(source: str, path: str, settings, runtime: RuntimeChoice) -> RewriteResult:
    if settings is None:
        from graphify.config import Settings

        settings = Settings()
    result = analyze_module(source, path, settings)
    out = RewriteResult(path, source, source, errors=list(result.report.errors))
    if result.module is None or not result.loops:
        return out
    tree = result.module.tree
    taken = result.module.names
    emissions = []
    for analysis in result.loops:
        loop = analysis.loop
        line = loop.module.position(loop.node).start.line
        outcome = LoopOutcome(path, line, loop.kind, loop.func.qualname, analysis.verdict, False, list(analysis.reasons))
        outcome.partial_refusal = analysis.partial_refusal
        out.outcomes.append(outcome)
        plan = analysis.plan
        if plan is None:
            continue
        outer = loop.outer_loops
        if isinstance(plan, PartialPlan):
            graphed = []
            for model in plan.models:
                # before the outermost loop that does not assign the model, so that it graphs the current model
                anchor = next((a for a in outer if not _rebinds(a, model)), loop.node)
                graphed.append(fresh_name(f"graphed_{model.rsplit('.', 1)[-1]}", taken))
                emissions.append(Emission(plan, graphed[-1], anchor, model))
            step_name, outcome.graphed = ", ".join(graphed), graphed
        else:
            emissions.append(_whole_step(plan, next(iter(outer), loop.node), taken, settings.defer_host_reads))
            step_name = emissions[-1].step_name
        outcome.rewritten, outcome.step_name, outcome.model_only = True, step_name, isinstance(plan, PartialPlan)
    if not emissions:
        return out
    names, new = bound_runtime_names(tree), []
    for class_name, used in _uses(emissions).items():
        if class_name in names or not (used or runtime.mode == "inline"):
            continue
        names[class_name] = class_name if class_name not in taken else fresh_name(class_name, taken)
        new.append(class_name)
    new_tree = tree.visit(Rewriter(emissions, names, runtime_header(runtime, names, new)))
    code = with_runtime_imports(new_tree, runtime, names, new).code
    try:
        compile(code, path, "exec")
    except SyntaxError as e:  # never hand back code that does not parse
        if python_syntax_error(source, path) is not None:  # newer syntax than this Python's (libcst reads it)
            why = f"it uses syntax Python {sys.version_info[0]}.{sys.version_info[1]} cannot compile ({e.msg}, line {e.lineno}); run graphify with the Python the script is for"
        else:
            why = f"internal error: the rewrite would not parse ({e.msg}, line {e.lineno})"
        out.errors.append(FileError(path, f"{why}; file left unchanged"))
        for o in out.outcomes:
            o.rewritten = False
        return out
    out.code = code
    return out


def _whole_step(plan, anchor: cst.CSTNode, taken: set[str], defer_host_reads: bool) -> Emission:
    """The emission of a whole-step plan: its step function's name, and with --defer-host-reads what runs a step later."""
    step_name = fresh_name("train_step" if plan.kind == "train" else "inference_step", taken)
    deferral = None
    if defer_host_reads:
        after = [s for _, s in after_replay(plan, plan.statements)]
        deferral = plan_deferral(plan, after, taken, f"{step_name}_reads")
    return Emission(plan, step_name, anchor, deferral=deferral)


def _uses(emissions: list[Emission]) -> dict[str, bool]:
    """Which runtime classes the rewrite calls."""
    uses = {
        CAPTURED_STEP: any(not isinstance(e.plan, PartialPlan) for e in emissions),
        GRAPHED_MODULE: any(isinstance(e.plan, PartialPlan) for e in emissions),
        DDP_BUILDER: any(not isinstance(e.plan, PartialPlan) and e.plan.ddp_builds for e in emissions),
    }
    if any(e.deferral for e in emissions):  # named only where used: files rewritten without it stay as they were
        uses[DEFERRED_READS] = True
    return uses


def _rebinds(loop: cst.CSTNode, model: str) -> bool:
    """Whether a loop assigns the model's name (`model = ...`), or for `self.model` that attribute or `self`."""
    root = model.split(".", 1)[0]
    return root in names_written(loop) or any(
        dotted(t) == model for n in walk(loop) if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign)) for t in attribute_targets(n)
    )
