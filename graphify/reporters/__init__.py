"""Output formats for `graphify check`: one module each (text, json, sarif, github, statistics).

`concise` (the default; `text` is its other name) and `full` are the text module's two layouts: one line
per breaker, or each with its code frame and fix hint.

Every reporter takes a Report and returns the whole output as a string. Lines and columns are
1-based in every format; `end_column` is exclusive (the column after the last character), as in
SARIF regions.
"""

from __future__ import annotations

import importlib

from graphify.model import Report
from graphify.reporters.common import REPOSITORY_URL, rule_url  # noqa: F401  (re-exported)

FORMATS = ("concise", "full", "text", "json", "sarif", "github")
TEXT_FORMATS = ("concise", "full", "text")


def render(report: Report, fmt: str, *, color: bool = False, statistics: bool = False) -> str:
    """The whole output of `graphify check` for `fmt` (or its `--statistics` table)."""
    if statistics:
        from graphify.reporters.statistics import render as render_statistics

        return render_statistics(report, as_json=fmt == "json")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    if fmt in TEXT_FORMATS:
        from graphify.reporters.text import render as render_text

        return render_text(report, color=color, full=fmt == "full")
    module = importlib.import_module(f"graphify.reporters.{fmt}")
    return module.render(report)
