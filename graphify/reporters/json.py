"""`--format json`: one document, schema version 3.

    {"version": 3,
     "diagnostics": [{"path", "cell", "line", "column", "end_line", "end_column", "code", "name", "category",
                      "severity", "message", "fix", "loop_line", "related", "loops"}],
     "loops": [{"path", "cell", "line", "end_line", "kind", "function", "verdict", "reasons"}],
     "errors": [{"path", "message"}]}

Lines and columns are 1-based; end_column is exclusive. `cell` is null in a script; in a notebook it
is the code cell (from 1) and lines count within it (version 2 added `cell`). Diagnostics and loops are sorted by path
and position. Adding a key is a new version.

Version 3 added `related` and `loops` to each diagnostic. A breaker inside a function the loop calls is
located at the call in the loop; `related` holds the flagged code itself, each as {"path", "cell", "line",
"column", "end_line", "end_column", "message"} (message: "in helper `get_batch`"), and is empty for a breaker
in the loop's own code. `loops` lists every loop the diagnostic concerns as {"path", "cell", "line"}, the
first being `loop_line`'s: a breaker shared by loops (a DataLoader built once) is reported once.
"""

from __future__ import annotations

import json

from graphify.model import Diagnostic, LoopReport, Related, Report
from graphify.reporters.common import sorted_diagnostics, sorted_loops

VERSION = 3


def diagnostic_dict(d: Diagnostic, report: Report) -> dict:
    cell, line = report.locate(d.path, d.line)
    return {
        "path": d.path,
        "cell": cell,
        "line": line,
        "column": d.column,
        "end_line": report.locate(d.path, d.end_line)[1],
        "end_column": d.end_column,
        "code": d.code,
        "name": d.rule.name,
        "category": d.rule.category,
        "severity": d.rule.severity.value,
        "message": d.message,
        "fix": d.fix,
        "loop_line": report.locate(d.loop_path, d.loop_line)[1],
        "related": [related_dict(r, report) for r in d.related],
        "loops": [dict(zip(("path", "cell", "line"), (path, *report.locate(path, line)), strict=True)) for path, line in d.affected_loops],
    }


def related_dict(r: Related, report: Report) -> dict:
    cell, line = report.locate(r.path, r.line)
    return {
        "path": r.path,
        "cell": cell,
        "line": line,
        "column": r.column,
        "end_line": report.locate(r.path, r.end_line)[1],
        "end_column": r.end_column,
        "message": r.message,
    }


def loop_dict(loop: LoopReport, report: Report) -> dict:
    cell, line = report.locate(loop.path, loop.line)
    return {
        "path": loop.path,
        "cell": cell,
        "line": line,
        "end_line": report.locate(loop.path, loop.end_line)[1],
        "kind": loop.kind,
        "function": loop.function,
        "verdict": loop.verdict.value,
        "reasons": list(loop.reasons),
    }


def render(report: Report) -> str:
    doc = {
        "version": VERSION,
        "diagnostics": [diagnostic_dict(d, report) for d in sorted_diagnostics(report)],
        "loops": [loop_dict(lp, report) for lp in sorted_loops(report)],
        "errors": [{"path": e.path, "message": e.message} for e in sorted(report.errors, key=lambda e: e.path)],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
