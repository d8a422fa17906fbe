"""`--format json`: one document, schema version 1.

    {"version": 1,
     "diagnostics": [{"path", "line", "column", "end_line", "end_column", "code", "name", "category",
                      "severity", "message", "fix", "loop_line"}],
     "loops": [{"path", "line", "end_line", "kind", "function", "verdict", "reasons"}],
     "errors": [{"path", "message"}]}

Lines and columns are 1-based; end_column is exclusive. Diagnostics and loops are sorted by path
and position. Adding a key is a new version.
"""

from __future__ import annotations

import json

from graphify.model import Diagnostic, LoopReport, Report
from graphify.reporters.common import sorted_diagnostics, sorted_loops

VERSION = 1


def diagnostic_dict(d: Diagnostic) -> dict:
    return {
        "path": d.path,
        "line": d.line,
        "column": d.column,
        "end_line": d.end_line,
        "end_column": d.end_column,
        "code": d.code,
        "name": d.rule.name,
        "category": d.rule.category,
        "severity": d.rule.severity.value,
        "message": d.message,
        "fix": d.fix,
        "loop_line": d.loop_line,
    }


def loop_dict(loop: LoopReport) -> dict:
    return {
        "path": loop.path,
        "line": loop.line,
        "end_line": loop.end_line,
        "kind": loop.kind,
        "function": loop.function,
        "verdict": loop.verdict.value,
        "reasons": list(loop.reasons),
    }


def render(report: Report) -> str:
    doc = {
        "version": VERSION,
        "diagnostics": [diagnostic_dict(d) for d in sorted_diagnostics(report)],
        "loops": [loop_dict(lp) for lp in sorted_loops(report)],
        "errors": [{"path": e.path, "message": e.message} for e in sorted(report.errors, key=lambda e: e.path)],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
