"""Every transformation on every single-file fixture and trap, and what graphify decides on each pair: the
loops found (kind, verdict, codes of their findings), the file's codes, and what the rewrite does."""

from __future__ import annotations

import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from graphify.config import Settings
from graphify.engine import analyze_module

from . import TRANSFORMATIONS, Transformation

ROOT = Path(__file__).resolve().parents[2]
CORPUS = (ROOT / "fixtures" / "check", ROOT / "fixtures" / "traps")
KNOWN_DIFFERENCES = Path(__file__).with_name("known_differences.txt")

# fixture markers are trailing comments: analysis ignores them, but a transformation moving lines would
# leave them on the wrong ones
_MARKER = re.compile(r"[ \t]*#\s*(expect|loop):[^\n]*")
_REWRITE_CODE = re.compile(r"GFY7\d\d")


def scripts() -> list[Path]:
    return sorted(p for folder in CORPUS for p in folder.glob("*.py"))


def script_name(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def unmarked(source: str) -> str:
    return _MARKER.sub("", source)


@dataclass(frozen=True)
class LoopDecision:
    kind: str
    verdict: str
    codes: frozenset[str]  # of the findings reported for this loop
    rewritten: bool
    refusals: frozenset[str]  # the GFY7xx codes among its reasons

    def describe(self) -> str:
        codes = ",".join(sorted(self.codes)) or "-"
        return f"{self.kind} {self.verdict} [{codes}] {'rewritten' if self.rewritten else 'kept'}"


@dataclass(frozen=True)
class Decision:
    loops: tuple[LoopDecision, ...]
    codes: frozenset[str]
    changed: bool
    errors: tuple[str, ...]


def decide(source: str, path: str) -> Decision:
    """What `check` reports and what `rewrite` does on one source, line numbers left out. One analysis serves both,
    as in graphify itself: `check` reports its loops and findings, and `rewrite` rewrites the loops it planned
    (graphify.rewrite.api), keeping the rest with their reasons."""
    result = analyze_module(source, path, Settings())
    report = result.report
    loops = []
    for analysis, loop in sorted(zip(result.loops, report.loops), key=lambda pair: pair[1].line):
        codes = frozenset(d.code for d in report.diagnostics if (loop.path, loop.line) in d.affected_loops)
        refusals = frozenset(c for r in analysis.reasons for c in _REWRITE_CODE.findall(r))
        loops.append(LoopDecision(loop.kind, loop.verdict.value, codes, analysis.plan is not None, refusals))
    changed = any(lp.rewritten for lp in loops)
    return Decision(tuple(loops), frozenset(d.code for d in report.diagnostics), changed, tuple(e.message for e in report.errors))


def same_codes(decision: Decision, mapping: dict[str, str]) -> Decision:
    """The decision with each code of `mapping` read as the code it maps to."""
    if not mapping:
        return decision

    def read(codes: frozenset[str]) -> frozenset[str]:
        return frozenset(mapping.get(c, c) for c in codes)

    loops = tuple(LoopDecision(lp.kind, lp.verdict, read(lp.codes), lp.rewritten, lp.refusals) for lp in decision.loops)
    return Decision(loops, read(decision.codes), decision.changed, decision.errors)


def difference(before: Decision, after: Decision) -> str | None:
    """One line saying how two decisions differ, None when they agree."""
    if before == after:
        return None
    if after.errors != before.errors:
        return f"errors {list(before.errors)} -> {list(after.errors)}"
    if len(before.loops) != len(after.loops):
        return f"{len(before.loops)} loops -> {len(after.loops)}: {_loops(before)} -> {_loops(after)}"
    for i, (a, b) in enumerate(zip(before.loops, after.loops)):
        if a != b:
            return f"loop {i + 1}: {_loop_change(a, b)}"
    if before.codes != after.codes:
        return f"file codes {_codes_change(before.codes, after.codes)}"
    return f"rewrite changes the file: {before.changed} -> {after.changed}"


def _loops(decision: Decision) -> str:
    return "; ".join(lp.describe() for lp in decision.loops) or "none"


def _codes_change(a: frozenset[str], b: frozenset[str]) -> str:
    gone, new = sorted(a - b), sorted(b - a)
    return " ".join([*(f"-{c}" for c in gone), *(f"+{c}" for c in new)])


def _loop_change(a: LoopDecision, b: LoopDecision) -> str:
    parts = []
    if a.kind != b.kind:
        parts.append(f"kind {a.kind} -> {b.kind}")
    if a.verdict != b.verdict:
        parts.append(f"verdict {a.verdict} -> {b.verdict}")
    if a.codes != b.codes:
        parts.append(f"codes {_codes_change(a.codes, b.codes)}")
    if a.rewritten != b.rewritten:
        parts.append("no longer rewritten" if a.rewritten else "now rewritten")
    if a.refusals != b.refusals:
        parts.append(f"refusals {_codes_change(a.refusals, b.refusals)}")
    return ", ".join(parts)


@dataclass(frozen=True)
class Pair:
    transformation: str
    script: str
    difference: str | None  # None: graphify decides the same on both
    parses: bool = True  # False: the transformation broke the script (not compared)


def parses(source: str) -> bool:
    """Whether Python compiles the source (where libcst, which graphify parses with, would not read it, the
    analysis reports an error and the pair differs)."""
    try:
        compile(source, "<transformed>", "exec")
    except SyntaxError:
        return False
    return True


def transformed(transformation: Transformation, source: str) -> str | None:
    """The transformed source, None where the transformation does not apply (or leaves the source as it was)."""
    out = transformation.apply(source)
    return None if out == source else out


def _script_pairs(path: Path) -> list[Pair]:
    """Every applicable transformation of one script, its original analysed once."""
    source = unmarked(path.read_text())
    before = decide(source, str(path))
    pairs = []
    for t in TRANSFORMATIONS:
        out = transformed(t, source)
        if out is None:
            continue
        if not parses(out):
            pairs.append(Pair(t.name, script_name(path), None, parses=False))
            continue
        after = same_codes(decide(out, str(path)), t.same_codes)
        pairs.append(Pair(t.name, script_name(path), difference(same_codes(before, t.same_codes), after)))
    return pairs


def run(workers: int | None = None) -> list[Pair]:
    """Every applicable (transformation, script) pair, in script order; the scripts spread over `workers` processes."""
    with ProcessPoolExecutor(workers) as pool:
        return [pair for pairs in pool.map(_script_pairs, scripts()) for pair in pairs]


def known_differences(path: Path = KNOWN_DIFFERENCES) -> dict[tuple[str, str], str]:
    """`transformation script  reason` lines; `#` starts a comment."""
    known = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, script, *reason = line.split(maxsplit=2)
            known[(name, script)] = reason[0] if reason else ""
    return known
