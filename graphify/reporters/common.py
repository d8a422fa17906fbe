"""What every format shares: where rule docs are published, the order of diagnostics and loops, and where a
notebook's finding is in the .ipynb file."""

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


class FileLines:
    """The line of the file itself for a report line: in a script the same, in a notebook the line of the
    .ipynb file (JSON) that holds the code, read again from the file as the text report reads its
    snippets; None when the file is not the notebook analysed (standard input, changed since)."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self._notebooks: dict = {}

    def __call__(self, path: str, line: int) -> int | None:
        cell, in_cell = self.report.locate(path, line)
        if cell is None:
            return line
        notebook = self._notebook(path)
        return notebook.file_line(cell, in_cell) if notebook else None

    def _notebook(self, path: str):
        from graphify.files import SourceError
        from graphify.notebooks import read_notebook

        if path not in self._notebooks:
            try:
                notebook = read_notebook(path)
            except SourceError:
                notebook = None
            self._notebooks[path] = notebook if notebook and notebook.starts == self.report.cell_starts[path] else None
        return self._notebooks[path]
