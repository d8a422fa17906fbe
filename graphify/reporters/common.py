"""What every format shares: where rule docs are published, the order of diagnostics and loops."""

from __future__ import annotations

from graphify.model import Diagnostic, LoopReport, Report

# Where a rule's documentation lives in the repository (its source, beside the rule).
REPOSITORY_URL = "https://github.com/graphify/graphify"
RULE_DOC_URL = REPOSITORY_URL + "/blob/main/graphify/rules/docs/{code}.md"


def rule_url(code: str) -> str:
    return RULE_DOC_URL.format(code=code)


def sorted_diagnostics(report: Report) -> list[Diagnostic]:
    return sorted(report.diagnostics, key=Diagnostic.sort_key)


def sorted_loops(report: Report) -> list[LoopReport]:
    return sorted(report.loops, key=lambda lp: (lp.path, lp.line))
