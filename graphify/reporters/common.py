"""What every format shares: where rule docs are published, the order of diagnostics and loops, and where a
notebook's finding is in the .ipynb file."""

from __future__ import annotations

from graphify.model import Diagnostic, LoopReport, Report

REPOSITORY_URL = "https://github.com/graphify/graphify"


def rule_path(code: str) -> str:
    """The rule's module in the repository (graphify/rules/<family>/gfyNNN_<name>.py): its DOC, the rule's
    page, stands beside its code."""
    from graphify.rules import unit_of  # the registry loads every rule: only when a format names one

    unit = unit_of(code)
    if unit is None:
        raise KeyError(f"no rule {code}")
    return unit.__name__.replace(".", "/") + ".py"


def rule_url(code: str) -> str:
    """Where a rule's documentation lives: its module on the repository's main branch."""
    return f"{REPOSITORY_URL}/blob/main/{rule_path(code)}"


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
