"""A stand-in for graphify.engine.analyze_source with the same contract, for the CLI tests.

It finds "loops" (lines starting with `for `), reports `NAME.item()` as GFY001 (rewritable) and
`torch.nonzero(` as GFY008 (not rewritable) inside them, honours settings and suppressions like the
engine, reports syntax errors as a FileError, and raises on a line `RAISE_INTERNAL`.
"""

from __future__ import annotations

import re

from graphify.model import Diagnostic, FileError, LoopReport, Report, Verdict
from graphify.rules import rules_by_code
from graphify.suppressions import parse_suppressions

_PATTERNS = (("GFY001", re.compile(r"\w+\.item\(\)")), ("GFY008", re.compile(r"torch\.nonzero\(")))


def fake_analyze_source(source: str, path: str, settings) -> Report:
    report = Report(files_checked=1)
    if "RAISE_INTERNAL" in source:
        raise RuntimeError("boom")
    try:
        compile(source, path, "exec")
    except SyntaxError as e:
        report.errors.append(FileError(path, f"syntax error at line {e.lineno}: {e.msg}"))
        return report
    rules = rules_by_code()
    sup = parse_suppressions(source)
    loop = None
    for n, line in enumerate(source.splitlines(), 1):
        if line.startswith("for "):
            loop = LoopReport(path, n, n, "train", "main", Verdict.CAPTURABLE, [])
            report.loops.append(loop)
            continue
        if loop is None or not line.startswith(" "):
            continue
        loop.end_line = n
        for code, pattern in _PATTERNS:
            for m in pattern.finditer(line):
                rule = rules[code]
                if not settings.enabled(rule, path) or sup.suppressed(code, n):
                    continue
                report.diagnostics.append(
                    Diagnostic(
                        path,
                        n,
                        m.start() + 1,
                        n,
                        m.end() + 1,
                        rule,
                        f"{m.group(0)} breaks capture",
                        "do something else",
                        path,
                        loop.line,
                        rule.rewritable,
                    )
                )
    for loop in report.loops:
        codes = {d.code for d in report.diagnostics if d.loop_line == loop.line}
        blocking = sorted(c for c in codes if not rules[c].rewritable)
        if blocking:
            loop.verdict, loop.reasons = Verdict.NOT_CAPTURABLE, blocking
        elif codes:
            loop.verdict = Verdict.AFTER_REWRITE
    return report


BAD_SCRIPT = """import torch

for x in loader:
    loss = model(x)
    loss.backward()
    total += loss.item()
"""

CLEAN_SCRIPT = """import torch

for x in loader:
    loss = model(x)
    loss.backward()
    total += loss.detach()
"""
