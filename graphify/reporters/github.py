"""`--format github`: GitHub Actions workflow commands, one annotation per line.

    ::error title=graphify (GFY001),file=train.py,line=15,col=17,endLine=15,endColumn=28::message

Error-severity rules give `::error`, warnings `::warning`, info `::notice`; files that could not be
analysed give `::error file=...,title=graphify::message`. In a notebook the annotation sits on the line
of the .ipynb file (JSON) that holds the code, where GitHub shows the file's lines, without columns; the
title names the cell (`graphify (GFY001) cell 3`) and the message starts with `cell 3:LINE:COL: `, as
Jupyter counts lines. A breaker inside a function the loop calls sits on the call in the loop, and the
message names the helper's line ("in helper `get_batch` at train.py:61"), as the concise text does.
"""

from __future__ import annotations

from graphify.model import Diagnostic, Report, Severity
from graphify.reporters.common import FileLines, sorted_diagnostics
from graphify.reporters.text import notes

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(s: str) -> str:
    return _data(s).replace(":", "%3A").replace(",", "%2C")


def render(report: Report) -> str:
    file_lines = FileLines(report)
    out = [_annotation(d, report, file_lines) for d in sorted_diagnostics(report)]
    for e in sorted(report.errors, key=lambda e: e.path):
        out.append(f"::error title=graphify,file={_prop(e.path)}::{_data(e.message)}")
    return "".join(line + "\n" for line in out)


def _annotation(d: Diagnostic, report: Report, file_lines: FileLines) -> str:
    cell, line = report.locate(d.path, d.line)
    where = {"line": line, "col": d.column, "endLine": report.locate(d.path, d.end_line)[1], "endColumn": d.end_column}
    message = d.message + "".join(f" ({note})" for note in notes(d, report))
    if cell:  # the annotation sits on the .ipynb file's line holding the code; the cell's position leads the message
        start, end = file_lines(d.path, d.line), file_lines(d.path, d.end_line)
        where = {"line": start, "endLine": end} if start and end else {}
        message = f"cell {cell}:{line}:{d.column}: {message}"
    title = f"graphify ({d.code})" + (f" cell {cell}" if cell else "")
    props = ",".join(f"{k}={_prop(str(v))}" for k, v in (("title", title), ("file", d.path), *where.items()))
    return f"::{_COMMAND.get(d.rule.severity, 'error')} {props}::{_data(message)}"
