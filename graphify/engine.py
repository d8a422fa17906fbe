"""One analysis, shared by `check` and `rewrite`: parse, find loops, run the rules, decide verdicts."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field

import libcst as cst

from graphify.analysis.checker import Checker, Finding, code_of, removable
from graphify.analysis.discovery import ModuleAnalysis
from graphify.analysis.region import Loop, Site
from graphify.analysis.hand_capture import captured_kind
from graphify.analysis.rewritten import RUNTIME_HELPERS, in_pasted_runtime, is_vendored_runtime, runtime_helper_assignments
from graphify.analysis.statements import contains, walk
from graphify.analysis.prefilter import might_hold_loops
from graphify.analysis.program import ModuleInfo, Program
from graphify.analysis.tree import children, descendants, forget, nested_too_deep
from graphify.files import python_syntax_error
from graphify.model import Diagnostic, FileError, LoopReport, Related, Report, Verdict
from graphify.plan import PartialPlan, Plan, Refusal, make_partial_plan, make_plan
from graphify.plan.refusals import HOST_SIDE_EFFECT, MUTATED_STATE, PER_STEP_HOST_VALUE


_CODE_FACTS = (PER_STEP_HOST_VALUE, HOST_SIDE_EFFECT, MUTATED_STATE)
# Breakers that, left eager beside a captured step, keep each iteration waiting outside the graph: a
# host read that later GPU work needs, a branch on a tensor value, a collective. Those that only prepare
# the step's inputs (seeding, tensors built from host data, a custom generator's draws) run ahead of it.
_WAITS_OUTSIDE_THE_GRAPH = {"host-sync", "data-dependent-branch", "distributed"}


@dataclass
class LoopAnalysis:
    loop: Loop
    findings: list[Finding] = field(default_factory=list)  # what check reports: after settings and suppressions
    all_findings: list[Finding] = field(default_factory=list)  # what the rewrite must respect: every finding
    verdict: Verdict = Verdict.CAPTURABLE
    reasons: list[str] = field(default_factory=list)  # rule codes, or why the rewrite cannot capture it
    plan: Plan | PartialPlan | None = None  # the rewrite plan, when the loop can be captured
    fetches: list[cst.Call] = field(default_factory=list)  # `next(...)` calls the rewrite fetches before the step
    partial_refusal: str | None = None  # for a training loop refused whole: why its models are not graphed alone either


@dataclass
class ModuleResult:
    module: ModuleInfo | None
    loops: list[LoopAnalysis]
    report: Report


@contextmanager
def _collector_paused():
    """A parsed module is hundreds of thousands of acyclic nodes: the cyclic collector's passes over
    them, while they are built and walked, find nothing and cost about a quarter of the analysis.
    Its first pass after the module frees that module's cycles."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


REWRITTEN = "graphify runtime"  # the reason given for a loop that replays a CapturedStep or GraphedModule
TOO_DEEP = "nested too deeply to analyse (an expression or block beyond Python's recursion limit)"


def analyze_module(source: str, path: str, settings, program: Program | None = None) -> ModuleResult:
    with _collector_paused():
        try:
            return _analyze_module(source, path, settings, program)
        except RecursionError:
            return ModuleResult(None, [], Report(files_checked=1, errors=[FileError(path, TOO_DEEP)]))


def _analyze_module(source: str, path: str, settings, program: Program | None) -> ModuleResult:
    report = Report(files_checked=1)
    rewritten = any(f"{helper}(" in source for helper in RUNTIME_HELPERS)  # its loops may no longer step themselves
    if not (might_hold_loops(source) or rewritten) or is_vendored_runtime(source):
        return ModuleResult(None, [], report)
    if nested_too_deep(source):  # libcst's native parser would overflow the C stack (a crash, not an error)
        report.errors.append(FileError(path, TOO_DEEP))
        return ModuleResult(None, [], report)
    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        report.errors.append(FileError(path, _syntax_error(source, path, e)))
        return ModuleResult(None, [], report)
    forget()
    program = program or Program()
    module = program.add(path, source, tree)
    reported = _Reported(settings)
    results = []
    loops = ModuleAnalysis(module)
    for loop in loops.loops():
        if in_pasted_runtime(loop.ancestors):
            continue
        analysis = LoopAnalysis(loop)
        if loop.by_hand:  # the script captures this step itself: nothing to flag, nothing to rewrite
            analysis.verdict = Verdict.ALREADY_CAPTURED
            results.append(analysis)
            _report_loop(analysis, path, report)
            continue
        seen = set()
        for finding in _detect(Checker(loop)):
            key = (id(finding.node), finding.rule.code)
            if key in seen:
                continue
            seen.add(key)
            analysis.all_findings.append(finding)
            if reported(finding, loop):
                analysis.findings.append(finding)
        _decide(analysis)
        blocked = analysis.verdict == Verdict.NOT_CAPTURABLE
        refusals = _confirm_rewrite(analysis, module)
        for finding in _refusal_findings(analysis, refusals, blocked):
            if reported(finding, loop):
                analysis.findings.append(finding)
        for fetch in analysis.fetches:
            # a batch taken with next() in the step breaks capture as written; the rewrite fetches it ahead
            message = f"the step takes a batch with `{code_of(fetch)}`; capture would take it only once"
            fix = "graphify rewrite fetches it before the replay, in the same order"
            finding = Finding(HOST_SIDE_EFFECT, fetch, _module_of(loop, fetch), message, fix, True)
            analysis.all_findings.append(finding)
            if reported(finding, loop):
                analysis.findings.append(finding)
        if analysis.verdict == Verdict.NOT_CAPTURABLE:
            _try_partial(analysis, refusals)
        results.append(analysis)
        _report_loop(analysis, path, report)
    _report_rewritten(loops, path, report)
    return ModuleResult(module, results, report)


def _detect(checker: Checker) -> list[Finding]:
    """Every rule's findings in one loop: family by family, each family's in the order its walk reached them."""
    from graphify.rules import detectors

    found = []
    for family in detectors():
        findings = [f for detect in family for f in detect(checker)]
        findings.sort(key=lambda f: f.order if f.order is not None else (checker.position(f.node),))
        found += findings
    return found


class _Reported:
    """Whether check reports a finding: its rule is selected for the file, and no comment suppresses it on
    its line or, for a finding inside a function the loop calls, on the call in the loop where it is
    reported (_report_loop)."""

    def __init__(self, settings) -> None:
        self.settings = settings
        self.suppressions: dict[str, object] = {}

    def __call__(self, finding: Finding, loop: Loop) -> bool:
        if not self.settings.enabled(finding.rule, finding.module.path):
            return False
        if self._suppressed(finding.module, finding.rule.code, finding.node):
            return False
        at_call = _at_the_loops_call(loop, finding.node)
        return at_call is None or not self._suppressed(loop.module, finding.rule.code, at_call[0])

    def _suppressed(self, where: ModuleInfo, code: str, node: cst.CSTNode) -> bool:
        from graphify.suppressions import parse_suppressions

        sup = self.suppressions.get(where.path)
        if sup is None:
            sup = self.suppressions[where.path] = parse_suppressions(where.source)
        return sup.suppressed(code, where.position(node).start.line)


def _refusal_findings(analysis: LoopAnalysis, refusals: list[Refusal], blocked: bool) -> list[Finding]:
    """The planner's own reasons, each where it stands: every value or effect of the code that capture
    would freeze, and the reason that decides the verdict unless one of those is what it suspects."""
    loop = analysis.loop
    shown = [r for r in refusals if r.certain and r.rule in _CODE_FACTS]
    first = refusals[0] if refusals and not blocked else None
    if first is not None and first not in shown and not any(r.node is not None and contains(first.node, r.node) for r in shown):
        shown.insert(0, first)
    # where a breaker is reported already (the same statement, or a logging call around the node), the planner sees it again
    flagged = {id(n) for f in analysis.all_findings for n in (walk(f.node) if f.rule.category == "logging-io" else [f.node])}
    findings = []
    for refusal in shown:
        node = refusal.node or loop.node  # a reason about the loop as a whole: told at its header
        if refusal.node is not None and any(id(n) in flagged for n in _own_lines(node)):
            continue
        flagged.add(id(node))
        fix = refusal.rule.fix.advice or f"see `graphify rule {refusal.rule.code}`"
        # what the planner refuses, the rewrite does not remove; found inside a function the loop calls, it
        # is reported at the call, once per call and code (_report_loop, _merge_duplicates)
        findings.append(Finding(refusal.rule, node, _module_of(loop, node), str(refusal), fix, False))
    return findings


def _at_the_loops_call(loop: Loop, node: cst.CSTNode) -> tuple[cst.Call, Site] | None:
    """For a node inside a function the loop calls: the call in the loop body that leads to it, where the
    user acts on it (`top.update(...)`), and the node's own site; None for the loop's own code and for
    code outside the loop (a DataLoader or an optimizer built before it)."""
    site = next((site for n, site in loop.region.nodes if n is node), None)
    call = loop.region.body_call_of(site) if site is not None and site.block is not loop.region.body_block else None
    return (call, site) if call is not None else None


def _own_lines(node: cst.CSTNode):
    """The node's own code: a compound statement's header, or all of anything else."""
    if not isinstance(node, cst.BaseCompoundStatement):
        return walk(node)
    header = [c for c in children(node) if not isinstance(c, (cst.BaseSuite, cst.BaseStatement, cst.Else, cst.ExceptHandler, cst.Finally))]
    return [node, *(n for c in header for n in walk(c))]


def _module_of(loop: Loop, node: cst.CSTNode) -> ModuleInfo:
    """The module holding a node of the loop's region (a called function may live in a sibling file)."""
    return next((site.block.module for n, site in loop.region.nodes if n is node), loop.module)


def _syntax_error(source: str, path: str, error: cst.ParserSyntaxError) -> str:
    """Python's own message and position ("'(' was never closed"), or libcst's when Python accepts the code."""
    python = python_syntax_error(source, path)
    if python and python.startswith("syntax error"):
        return python
    return f"syntax error at line {error.raw_line}, column {error.raw_column + 1}: {error.message}"


def _decide(analysis: LoopAnalysis) -> None:
    """Suppressions and settings change what check reports, never what the rewrite treats as safe."""
    blocking = sorted({f.rule.code for f in analysis.all_findings if not removable(f)})
    if blocking:
        analysis.verdict, analysis.reasons = Verdict.NOT_CAPTURABLE, blocking
    elif analysis.all_findings:
        analysis.verdict = Verdict.AFTER_REWRITE
    else:
        analysis.verdict = Verdict.CAPTURABLE


def _confirm_rewrite(analysis: LoopAnalysis, module: ModuleInfo) -> list[Refusal]:
    """A loop is only called capturable if `graphify rewrite` can really capture it; returns every
    reason the planner found to refuse it (the first decides the verdict's reason)."""
    loop = analysis.loop
    refusals: list[Refusal] = []
    try:
        enclosing = loop.func.node if loop.func.node is not None else module.tree
        analysis.plan = make_plan(loop, analysis.all_findings, enclosing, refusals, analysis.fetches)
    except Refusal as refusal:
        if analysis.verdict != Verdict.NOT_CAPTURABLE:
            analysis.reasons = [refusal.reason]  # else the blocking findings stay the reasons
        analysis.verdict = Verdict.NOT_CAPTURABLE
        return refusals
    # breakers that stay outside the captured step run eagerly where they stand; where one of them
    # makes each iteration wait for the device or other processes, only part of the iteration replays
    waiting = sorted({f.rule.code for f in analysis.plan.eager if f.rule.category in _WAITS_OUTSIDE_THE_GRAPH})
    if waiting:
        analysis.verdict, analysis.reasons = Verdict.PARTIAL, waiting
        return refusals
    analysis.verdict = Verdict.AFTER_REWRITE if analysis.all_findings else Verdict.CAPTURABLE
    analysis.reasons = []
    return refusals


def _try_partial(analysis: LoopAnalysis, refusals: list[Refusal]) -> None:
    """A loop that cannot be captured whole because of what its step does around the model (host reads
    of the loss, a loss scaler, a per-step schedule) may still replay the model's forward and backward."""
    breakers = [(f.rule, f.node) for f in analysis.all_findings] + [(r.rule, r.node) for r in refusals]
    try:
        analysis.plan = make_partial_plan(analysis.loop, analysis.reasons, breakers)
    except Refusal as refusal:
        if analysis.loop.kind == "train":
            analysis.partial_refusal = f"{refusal} ({refusal.reason})"
        return
    analysis.verdict = Verdict.PARTIAL


def _report_loop(analysis: LoopAnalysis, path: str, report: Report) -> None:
    loop = analysis.loop
    pos = loop.module.position(loop.node)
    for f in analysis.findings:
        where = f.module.position(f.node)
        related: tuple[Related, ...] = ()
        at_call = _at_the_loops_call(loop, f.node)
        if at_call is not None:  # the helper's line becomes related information
            call, site = at_call
            helper = site.block.func.qualname or "a helper"
            related = (
                Related(
                    _path_of(f.module, loop, path),
                    where.start.line,
                    where.start.column + 1,
                    where.end.line,
                    where.end.column + 1,
                    f"in helper `{helper}`",
                ),
            )
            where = loop.module.position(call)
        report.diagnostics.append(
            Diagnostic(
                path=path if at_call is not None else _path_of(f.module, loop, path),
                line=where.start.line,
                column=where.start.column + 1,
                end_line=where.end.line,
                end_column=where.end.column + 1,
                rule=f.rule,
                message=f.message,
                fix=f.fix,
                loop_path=path,
                loop_line=pos.start.line,
                removable_by_rewrite=removable(f),
                related=related,
                loops=((path, pos.start.line),),
            )
        )
    report.loops.append(
        LoopReport(
            path=path,
            line=pos.start.line,
            end_line=pos.end.line,
            kind=loop.kind,
            function=loop.func.qualname,
            verdict=analysis.verdict,
            reasons=analysis.reasons,
        )
    )


def _report_rewritten(loops: ModuleAnalysis, path: str, report: Report) -> None:
    """Loops `graphify rewrite` turned into calls of a `CapturedStep` or `GraphedModule`: discovery leaves
    them out (nothing is left to capture), and check says what they are rather than nothing. Of an epoch
    loop around a batch loop, the innermost loop making the call is the rewritten one."""
    module = loops.module
    wrapped = dict(runtime_helper_assignments(module))  # name bound -> what it wraps
    if not wrapped:
        return
    calling = {}
    for node, func, ancestors in loops.loop_sites():
        called = {n.func.value for n in descendants(node.body) if isinstance(n, cst.Call) and isinstance(n.func, cst.Name)} & wrapped.keys()
        if called and not in_pasted_runtime(ancestors):
            calling[id(node)] = (node, func, ancestors, called)
    outer = {id(a) for *_, ancestors, _ in calling.values() for a in ancestors}
    steps = {n.name.value: n for n in descendants(module.tree) if isinstance(n, cst.FunctionDef)}
    for node, func, _, called in calling.values():
        if id(node) in outer:
            continue
        kind = "train" if any(_trains(wrapped[name], steps, module) for name in called) else "inference"
        pos = module.position(node)
        report.loops.append(LoopReport(path, pos.start.line, pos.end.line, kind, func.qualname, Verdict.ALREADY_CAPTURED, [REWRITTEN]))


def _trains(wrapped: cst.BaseExpression | None, steps: dict[str, cst.FunctionDef], module: ModuleInfo) -> bool:
    """A GraphedModule wraps a model the loop trains; a CapturedStep, a step the rewrite named for its
    loop's kind (`inference_step`), or one that steps or runs backward itself."""
    name = wrapped.value if isinstance(wrapped, cst.Name) else ""
    if name.startswith("inference_step"):
        return False
    if name.startswith("train_step") or name not in steps:  # named by the rewrite, or a GraphedModule's model
        return True
    return captured_kind(module.function_info(steps[name], None), module) == "train"


def analyze_source(source: str, path: str, settings) -> Report:
    """Analyse one file's text; never raises for bad input (syntax errors come back in `errors`)."""
    result = analyze_module(source, path, settings)
    result.report.diagnostics = _merge_duplicates(result.report.diagnostics)
    return result.report


def _path_of(module: ModuleInfo, loop: Loop, path: str) -> str:
    return path if module is loop.module else module.path


def _merge_duplicates(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """One diagnostic per code and place, sorted: a breaker outside the loops that several loops share (the
    DataLoader, a DDP model) lists every loop; a call in the loop that reaches several flagged lines of a
    helper with the same code lists every line as related information."""
    merged: dict[tuple, Diagnostic] = {}
    for d in sorted(diagnostics, key=Diagnostic.sort_key):
        key = (d.path, d.line, d.column, d.end_line, d.end_column, d.code)
        first = merged.get(key)
        if first is None:
            merged[key] = d
            continue
        first.loops = first.loops + tuple(lp for lp in d.loops if lp not in first.loops)
        first.related = first.related + tuple(r for r in d.related if r not in first.related)
        first.removable_by_rewrite = first.removable_by_rewrite and d.removable_by_rewrite
    return list(merged.values())
