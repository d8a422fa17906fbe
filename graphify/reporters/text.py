"""Text output: each loop with its verdict, each breaker on one line under the loop it concerns, and a summary.

Concise (the default, `--output-format concise` or `text`), one line per breaker, as ruff prints:

    train.py:12: train loop in main(): not-capturable (GFY008)
    train.py:15:17: GFY001 `.item()` on `loss` waits for the GPU every step
    train.py:16:9: GFY201 `torch.tensor(...)` allocates every step (in helper `batch_of` at train.py:40)

    2 loops, 1 capturable, 0 capturable after rewrite, 1 not capturable, 2 breakers

Full (`--output-format full`): each breaker also with its source line, carets under the span, the helper's
line it stands for, and a fix hint:

    train.py:15:17: GFY001 `.item()` on `loss` waits for the GPU every step
       15 |         total += loss.item()
          |                  ^^^^^^^^^^^
      fix: accumulate on the GPU: `total += loss.detach()`

A breaker inside a function the loop calls stands at the call in the loop (where the user acts on it),
naming the helper's line; one that several loops share (a DataLoader built once) is listed once, under
the first, naming the others. File errors are not listed here (the CLI prints them to stderr); only
counted in the summary.
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


def render(
    report: Report, *, color: bool = False, source_lines: Callable[[str], list[str] | None] | None = None, full: bool = False
) -> str:
    """`full`: with code frames and fix hints; `source_lines(path)` gives a file's lines for them (default:
    read it again)."""
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
            out.extend(_diagnostic(d, lines_of, paint, report, full))
    for diags in groups.values():  # diagnostics whose loop is not in the report
        if out:
            out.append("")
        for d in diags:
            out.extend(_diagnostic(d, lines_of, paint, report, full))

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


def _diagnostic(d: Diagnostic, lines_of, paint, report: Report, full: bool) -> list[str]:
    head = f"{paint(f'{report.where(d.path, d.line)}:{d.column}:', BOLD)} {paint(d.code, _SEVERITY_COLOR.get(d.rule.severity, ''))} {d.message}"
    if not full:
        return [head + "".join(f" ({note})" for note in notes(d, report))]
    out = [head]
    out.extend(_frame(lines_of, d.path, d, paint, report))
    for r in d.related:
        out.append(f"  {paint('note:', CYAN)} {r.message} at {report.where(r.path, r.line)}:{r.column}")
        out.extend(_frame(lines_of, r.path, r, paint, report))
    if len(d.affected_loops) > 1:
        out.append(f"  {paint('note:', CYAN)} {_other_loops(d, report)}")
    if d.fix:
        out.append(f"  {paint('fix:', CYAN)} {d.fix}")
    return out


def notes(d: Diagnostic, report: Report) -> list[str]:
    """What a one-line diagnostic adds in parentheses: the helper's lines it stands for (in helper
    `get_batch` at train.py:61), and the other loops it concerns."""
    out = []
    by_message: dict[str, list[str]] = {}
    for r in d.related:
        places = by_message.setdefault(r.message, [])
        if report.where(r.path, r.line) not in places:
            places.append(report.where(r.path, r.line))
    out.extend(f"{message} at {', '.join(places)}" for message, places in by_message.items())
    if len(d.affected_loops) > 1:
        out.append(_other_loops(d, report))
    return out


def _other_loops(d: Diagnostic, report: Report) -> str:
    others = [report.where(path, line) for path, line in d.affected_loops[1:]]
    return f"also the loop{'s' if len(others) > 1 else ''} at {', '.join(others)}"


def _frame(lines_of, path: str, span, paint, report: Report) -> list[str]:
    lines = lines_of(path)
    if lines and 1 <= span.line <= len(lines):
        return _snippet(lines[span.line - 1], span, paint, report.locate(path, span.line)[1])
    return []


def _snippet(source_line: str, d, paint, shown_line: int) -> list[str]:
    """`d`: a Diagnostic or a Related (line, column, end_line, end_column)."""
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
