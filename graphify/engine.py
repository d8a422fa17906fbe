"""One analysis, shared by `check` and `rewrite`: parse, find loops, run the rules, decide verdicts."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from graphify.analysis.checker import Checker, Finding, removable
from graphify.analysis.discovery import ModuleAnalysis
from graphify.analysis.region import Loop
from graphify.analysis.prefilter import might_hold_loops
from graphify.analysis.program import ModuleInfo, Program
from graphify.analysis.tree import forget
from graphify.files import python_syntax_error
from graphify.model import Diagnostic, FileError, LoopReport, Report, Verdict
from graphify.plan import PARTIAL_OK, PartialPlan, Plan, Refusal, make_partial_plan, make_plan
from graphify.rules.rewrite_safety import FIXES


@dataclass
class LoopAnalysis:
    loop: Loop
    findings: list[Finding] = field(default_factory=list)  # what check reports: after settings and suppressions
    all_findings: list[Finding] = field(default_factory=list)  # what the rewrite must respect: every finding
    verdict: Verdict = Verdict.CAPTURABLE
    reasons: list[str] = field(default_factory=list)  # rule codes, or why the rewrite cannot capture it
    plan: Plan | PartialPlan | None = None  # the rewrite plan, when the loop can be captured


@dataclass
class ModuleResult:
    module: ModuleInfo | None
    loops: list[LoopAnalysis]
    report: Report


def analyze_module(source: str, path: str, settings, program: Program | None = None) -> ModuleResult:
    from graphify.rules import families
    from graphify.suppressions import parse_suppressions

    report = Report(files_checked=1)
    if not might_hold_loops(source):
        return ModuleResult(None, [], report)
    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        report.errors.append(FileError(path, _syntax_error(source, path, e)))
        return ModuleResult(None, [], report)
    forget()
    program = program or Program()
    module = program.add(path, source, tree)
    suppressions: dict[str, object] = {}
    results = []
    for loop in ModuleAnalysis(module).loops():
        checker = Checker(loop)
        analysis = LoopAnalysis(loop)
        seen = set()

        def reported(finding: Finding) -> bool:
            if not settings.enabled(finding.rule, finding.module.path):
                return False
            sup = suppressions.get(finding.module.path)
            if sup is None:
                sup = suppressions[finding.module.path] = parse_suppressions(finding.module.source)
            return not sup.suppressed(finding.rule.code, finding.module.position(finding.node).start.line)

        for family in families():
            for finding in family.check(checker):
                key = (id(finding.node), finding.rule.code)
                if key in seen:
                    continue
                seen.add(key)
                analysis.all_findings.append(finding)
                if reported(finding):
                    analysis.findings.append(finding)
        _decide(analysis)
        blocked = analysis.verdict == Verdict.NOT_CAPTURABLE
        refusal = _confirm_rewrite(analysis, module)
        if refusal is not None and not blocked:  # the planner's own reason: report it where it stands
            if refusal.node is not None and not any(f.node is refusal.node for f in analysis.all_findings):
                fix = FIXES.get(refusal.rule.code, "see `graphify rule " + refusal.rule.code + "`")
                finding = Finding(refusal.rule, refusal.node, _module_of(loop, refusal.node), str(refusal), fix)
                if reported(finding):
                    analysis.findings.append(finding)
        if analysis.verdict == Verdict.NOT_CAPTURABLE:
            _try_partial(analysis)
        results.append(analysis)
        _report_loop(analysis, path, report)
    return ModuleResult(module, results, report)


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


def _confirm_rewrite(analysis: LoopAnalysis, module: ModuleInfo):
    """A loop is only called capturable if `graphify rewrite` can really capture it; returns the
    planner's refusal, if any."""
    loop = analysis.loop
    try:
        analysis.plan = make_plan(loop, analysis.all_findings, loop.func.node if loop.func.node is not None else module.tree)
    except Refusal as refusal:
        if analysis.verdict != Verdict.NOT_CAPTURABLE:
            analysis.reasons = [refusal.reason]  # else the blocking findings stay the reasons
        analysis.verdict = Verdict.NOT_CAPTURABLE
        return refusal
    # breakers that stay outside the captured step run eagerly where they stand
    analysis.verdict = Verdict.AFTER_REWRITE if analysis.all_findings else Verdict.CAPTURABLE
    analysis.reasons = []
    return None


def _try_partial(analysis: LoopAnalysis) -> None:
    """A loop that cannot be captured whole only because of its optimizer side may still replay the
    model's forward and backward."""
    if not set(analysis.reasons) <= PARTIAL_OK:
        return
    try:
        analysis.plan = make_partial_plan(analysis.loop, analysis.reasons)
    except Refusal:
        return
    analysis.verdict = Verdict.PARTIAL


def _report_loop(analysis: LoopAnalysis, path: str, report: Report) -> None:
    loop = analysis.loop
    pos = loop.module.position(loop.node)
    for f in analysis.findings:
        where = f.module.position(f.node)
        report.diagnostics.append(
            Diagnostic(
                path=path if f.module is loop.module else f.module.path,
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


def analyze_source(source: str, path: str, settings) -> Report:
    """Analyse one file's text; never raises for bad input (syntax errors come back in `errors`)."""
    result = analyze_module(source, path, settings)
    result.report.diagnostics.sort(key=Diagnostic.sort_key)
    return result.report
