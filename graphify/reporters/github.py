"""`--format github`: GitHub Actions workflow commands, one annotation per line.

    ::error title=graphify (GFY001),file=train.py,line=15,col=17,endLine=15,endColumn=28::message

Error-severity rules give `::error`, warnings `::warning`, info `::notice`; files that could not be
analysed give `::error file=...,title=graphify::message`. In a notebook, lines count within the cell
named in the title (`graphify (GFY001) cell 3`).
"""

from __future__ import annotations

from graphify.model import Report, Severity
from graphify.reporters.common import sorted_diagnostics

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(s: str) -> str:
    return _data(s).replace(":", "%3A").replace(",", "%2C")


def render(report: Report) -> str:
    out = []
    for d in sorted_diagnostics(report):
        cell, line = report.locate(d.path, d.line)
        in_cell = f" cell {cell}" if cell else ""
        props = ",".join(
            f"{k}={_prop(str(v))}"
            for k, v in (
                ("title", f"graphify ({d.code}){in_cell}"),
                ("file", d.path),
                ("line", line),
                ("col", d.column),
                ("endLine", report.locate(d.path, d.end_line)[1]),
                ("endColumn", d.end_column),
            )
        )
        out.append(f"::{_COMMAND.get(d.rule.severity, 'error')} {props}::{_data(d.message)}")
    for e in sorted(report.errors, key=lambda e: e.path):
        out.append(f"::error title=graphify,file={_prop(e.path)}::{_data(e.message)}")
    return "".join(line + "\n" for line in out)
