"""Default output: loops with their verdicts, each breaker with its source line and a fix hint.

    train.py:12: train loop in main(): not-capturable (GFY008)
    train.py:15:17: GFY001 `.item()` on `loss` waits for the GPU every step
       15 |         total += loss.item()
          |                  ^^^^^^^^^^^
      fix: accumulate on the GPU: `total += loss.detach()`

    2 loops, 1 capturable, 0 capturable after rewrite, 1 not capturable, 1 breaker

File errors are not listed here (the CLI prints them to stderr); only counted in the summary.
"""

from __future__ import annotations

import re
from typing import Callable

from graphify.model import Diagnostic, LoopReport, Report, Severity, Verdict
from graphify.reporters.common import sorted_diagnostics, sorted_loops

_NEWLINE = re.compile(r"\r\n|\r|\n")  # Python's own line breaks (str.splitlines also splits on \f, \v...)

RESET = "\x1b[0m"
BOLD = "\x1b[1m"
RED = "\x1b[31m"
GREEN = "\x1b[32m"
YELLOW = "\x1b[33m"
BLUE = "\x1b[34m"
CYAN = "\x1b[36m"

_SEVERITY_COLOR = {Severity.ERROR: RED, Severity.WARNING: YELLOW, Severity.INFO: BLUE}
_VERDICT_COLOR = {
    Verdict.CAPTURABLE: GREEN,
    Verdict.AFTER_REWRITE: YELLOW,
    Verdict.PARTIAL: YELLOW,
    Verdict.NOT_CAPTURABLE: RED,
    Verdict.ALREADY_CAPTURED: GREEN,
}


def render(report: Report, *, color: bool = False, source_lines: Callable[[str], list[str] | None] | None = None) -> str:
    """`source_lines(path)` gives a file's lines for the snippets (default: read it again)."""
    paint = _painter(color)
    lines_of = source_lines or _SourceCache()
    out: list[str] = []

    groups: dict[tuple[str, int], list[Diagnostic]] = {}
    for d in sorted_diagnostics(report):
        groups.setdefault((d.loop_path, d.loop_line), []).append(d)

    for loop in sorted_loops(report):
        if out:
            out.append("")
        out.append(loop_line(loop, paint, report.where))
        for d in groups.pop((loop.path, loop.line), []):
            out.extend(_diagnostic(d, lines_of, paint, report))
    for diags in groups.values():  # diagnostics whose loop is not in the report
        if out:
            out.append("")
        for d in diags:
            out.extend(_diagnostic(d, lines_of, paint, report))

    if out:
        out.append("")
    out.append(summary(report))
    return "\n".join(out) + "\n"


def loop_line(loop: LoopReport, paint=lambda s, c: s, where=lambda path, line: f"{path}:{line}") -> str:
    function = f"in {loop.function}()" if loop.function else "at module level"
    verdict = paint(loop.verdict.value, _VERDICT_COLOR.get(loop.verdict, ""))
    reasons = f" ({', '.join(loop.reasons)})" if loop.reasons else ""
    return f"{paint(where(loop.path, loop.line) + ':', BOLD)} {loop.kind} loop {function}: {verdict}{reasons}"


def summary(report: Report) -> str:
    verdicts = [lp.verdict for lp in report.loops]
    parts = [
        _plural(len(verdicts), "loop"),
        f"{verdicts.count(Verdict.CAPTURABLE)} capturable",
        f"{verdicts.count(Verdict.AFTER_REWRITE)} capturable after rewrite",
        *([f"{verdicts.count(Verdict.PARTIAL)} partially capturable"] if Verdict.PARTIAL in verdicts else []),
        f"{verdicts.count(Verdict.NOT_CAPTURABLE)} not capturable",
        *([f"{verdicts.count(Verdict.ALREADY_CAPTURED)} already captured"] if Verdict.ALREADY_CAPTURED in verdicts else []),
        _plural(len(report.diagnostics), "breaker"),
    ]
    if report.errors:
        parts.append(_plural(len(report.errors), "error"))
    return ", ".join(parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _diagnostic(d: Diagnostic, lines_of, paint, report: Report) -> list[str]:
    head = f"{paint(f'{report.where(d.path, d.line)}:{d.column}:', BOLD)} {paint(d.code, _SEVERITY_COLOR.get(d.rule.severity, ''))} {d.message}"
    out = [head]
    lines = lines_of(d.path)
    if lines and 1 <= d.line <= len(lines):
        out.extend(_snippet(lines[d.line - 1], d, paint, report.locate(d.path, d.line)[1]))
    if d.fix:
        out.append(f"  {paint('fix:', CYAN)} {d.fix}")
    return out


def _snippet(source_line: str, d: Diagnostic, paint, shown_line: int) -> list[str]:
    line = source_line.rstrip()
    start = max(d.column - 1, 0)
    if d.end_line == d.line:
        end = max(d.end_column - 1, start + 1)
    else:  # a span over several lines: underline to the end of the first one
        end = max(len(line), start + 1)
    # Tabs: measure the caret offset on the tab-expanded text so it stays under the span.
    prefix = line[:start].expandtabs()
    width = len(line[:end].expandtabs()) - len(prefix)
    gutter = f"{shown_line:>5}"
    return [
        f"{gutter} | {line.expandtabs()}",
        f"{' ' * len(gutter)} | {' ' * len(prefix)}{paint('^' * max(width, 1), RED)}",
    ]


def _painter(color: bool):
    if not color:
        return lambda s, c: s
    return lambda s, c: f"{c}{s}{RESET}" if c else s


class _SourceCache:
    def __init__(self) -> None:
        self._cache: dict[str, list[str] | None] = {}

    def __call__(self, path: str) -> list[str] | None:
        if path not in self._cache:
            from graphify.files import SourceError
            from graphify.notebooks import load_module

            try:
                self._cache[path] = _NEWLINE.split(load_module(path)[0])
            except SourceError:
                self._cache[path] = None
        return self._cache[path]
