"""`--format sarif`: SARIF 2.1.0, for GitHub code scanning and other SARIF viewers.

`tool.driver.rules` lists every rule (id, name, short and full description, helpUri, default
level). Each result carries ruleId, ruleIndex, level, message and one location whose region has
1-based startLine/startColumn/endLine/endColumn (endColumn exclusive, as SARIF defines it; columns
count Unicode code points, as the run's `columnKind` says); the fix hint and the loop line go into
the result's properties. A breaker inside a function the loop calls is located at the call in the
loop, with the flagged code in the helper as the result's `relatedLocations` (message: "in helper
`get_batch`"); the lines of every loop a result concerns are the property `loopLines` (a breaker shared
by loops is one result). Files that could not be analysed are tool execution notifications, and make
`executionSuccessful` false.

A notebook's finding is located in the .ipynb file as viewers show it: the region is the line of the
file (JSON) holding the code, without columns; the message starts with ruff's `cell N:LINE:COL`, and
the properties hold `cell` and `cellRegion` (lines within the cell, columns).
"""

from __future__ import annotations

import json
import os
from urllib.parse import quote

from graphify import __version__
from graphify.model import Diagnostic, Related, Report, Rule, Severity
from graphify.reporters.common import REPOSITORY_URL, FileLines, rule_url, sorted_diagnostics

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _uri(path: str) -> str:
    posix = path.replace(os.sep, "/")
    if os.path.isabs(path):
        return "file://" + quote(posix if posix.startswith("/") else "/" + posix)
    if posix.startswith("./"):
        posix = posix[2:]
    return quote(posix)


def _rule_descriptor(rule: Rule) -> dict:
    try:
        from graphify.rules import rule_doc

        full = rule_doc(rule.code)
    except (OSError, ModuleNotFoundError):
        full = rule.summary
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": full},
        "helpUri": rule_url(rule.code),
        "defaultConfiguration": {"level": _LEVEL[rule.severity]},
        "properties": {"category": rule.category, "rewritable": rule.rewritable},
    }


def _result(d: Diagnostic, report: Report, rule_index: int, file_lines: FileLines) -> dict:
    cell, line = report.locate(d.path, d.line)
    region = {"startLine": line, "startColumn": d.column, "endLine": report.locate(d.path, d.end_line)[1], "endColumn": d.end_column}
    properties = {
        "fix": d.fix,
        "loopLine": report.locate(d.loop_path, d.loop_line)[1],
        "loopLines": [report.locate(path, line)[1] for path, line in d.affected_loops],
        "removableByRewrite": d.removable_by_rewrite,
    }
    message = d.message
    if cell:
        # viewers show the .ipynb file: the region is the file's line holding the code (its columns are the
        # JSON string's, not the cell's); the cell's own position is in the message and the properties
        properties = {"cell": cell, "cellRegion": region, **properties}
        start, end = file_lines(d.path, d.line), file_lines(d.path, d.end_line)
        region = {"startLine": start, "endLine": end} if start and end else None
        message = f"cell {cell}:{line}:{d.column}: {message}"
    result = {
        "ruleId": d.code,
        "ruleIndex": rule_index,
        "level": _LEVEL[d.rule.severity],
        "message": {"text": message},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(d.path)}, **({"region": region} if region else {})}}],
        "properties": properties,
    }
    if d.related:
        result["relatedLocations"] = [_related(i, r, report, file_lines) for i, r in enumerate(d.related)]
    return result


def _related(index: int, r: Related, report: Report, file_lines: FileLines) -> dict:
    cell, line = report.locate(r.path, r.line)
    region = {"startLine": line, "startColumn": r.column, "endLine": report.locate(r.path, r.end_line)[1], "endColumn": r.end_column}
    message = r.message
    if cell:  # as for the result: the .ipynb file's line, the cell's position in the message
        start, end = file_lines(r.path, r.line), file_lines(r.path, r.end_line)
        region = {"startLine": start, "endLine": end} if start and end else None
        message = f"cell {cell}:{line}:{r.column}: {message}"
    physical = {"artifactLocation": {"uri": _uri(r.path)}, **({"region": region} if region else {})}
    return {"id": index, "physicalLocation": physical, "message": {"text": message}}


def render(report: Report, rules: list[Rule] | None = None) -> str:
    """`rules`: the rules to describe (default: every registered rule plus any in the report)."""
    if rules is None:
        from graphify.rules import all_rules

        rules = all_rules()
    known = {r.code: r for r in rules}
    for d in report.diagnostics:
        known.setdefault(d.code, d.rule)
    ordered = sorted(known.values(), key=lambda r: r.code)
    index = {r.code: i for i, r in enumerate(ordered)}

    file_lines = FileLines(report)
    results = [_result(d, report, index[d.code], file_lines) for d in sorted_diagnostics(report)]
    notifications = [
        {
            "level": "error",
            "message": {"text": e.message},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(e.path)}}}],
        }
        for e in sorted(report.errors, key=lambda e: e.path)
    ]
    run = {
        "tool": {
            "driver": {
                "name": "graphify",
                "version": __version__,
                "informationUri": REPOSITORY_URL,
                "rules": [_rule_descriptor(r) for r in ordered],
            }
        },
        "invocations": [{"executionSuccessful": not report.errors, "toolExecutionNotifications": notifications}],
        "columnKind": "unicodeCodePoints",  # libcst's columns count characters, not UTF-16 units (SARIF's other kind)
        "results": results,
    }
    doc = {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
