"""`--format sarif`: SARIF 2.1.0, for GitHub code scanning and other SARIF viewers.

`tool.driver.rules` lists every rule (id, name, short and full description, helpUri, default
level). Each result carries ruleId, ruleIndex, level, message and one location whose region has
1-based startLine/startColumn/endLine/endColumn (endColumn exclusive, as SARIF defines it; columns
count Unicode code points, as the run's `columnKind` says); the fix hint and the loop line go into
the result's properties. Files that could not be analysed are tool execution notifications, and make
`executionSuccessful` false.
"""

from __future__ import annotations

import json
import os
from urllib.parse import quote

from graphify import __version__
from graphify.model import Report, Rule, Severity
from graphify.reporters.common import REPOSITORY_URL, rule_url, sorted_diagnostics

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

    results = []
    for d in sorted_diagnostics(report):
        cell, line = report.locate(d.path, d.line)
        in_cell = {"cell": cell} if cell else {}
        results.append(
            {
                "ruleId": d.code,
                "ruleIndex": index[d.code],
                "level": _LEVEL[d.rule.severity],
                "message": {"text": d.message},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": _uri(d.path)},
                            "region": {
                                "startLine": line,
                                "startColumn": d.column,
                                "endLine": report.locate(d.path, d.end_line)[1],
                                "endColumn": d.end_column,
                            },
                        }
                    }
                ],
                "properties": {
                    **in_cell,
                    "fix": d.fix,
                    "loopLine": report.locate(d.loop_path, d.loop_line)[1],
                    "removableByRewrite": d.removable_by_rewrite,
                },
            }
        )
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
