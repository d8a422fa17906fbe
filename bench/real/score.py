"""Score `graphify check` against the hand labels of the real-world suite.

    python bench/real/restore.py            # once: the scripts, byte-exact, into bench/real/src/
    python bench/real/score.py [--details] [--out bench/results/real_check.md]

Per script and in total:
  * breakers: recall of labelled (line, category) pairs, and precision of diagnostics: a diagnostic
    told at a call in the loop flags the helper's lines, and is right when the labels mark any of its
    lines (the call's or the helper's) with its category, a false alarm once otherwise; labels marked
    `ambiguous` count neither as a miss nor, when reported, as a false alarm;
  * loops found: labelled loops that `check` reports at the same line, and loops it reports that
    are not labelled;
  * verdicts: of the loops found, those whose verdict equals the label.
Labels follow bench/real/LABELS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from restore import DEFAULT_DEST, HERE, load_manifest, restored_path  # noqa: E402

LABELS = HERE / "labels"


@dataclass
class Score:
    hits: int = 0  # labelled breakers some diagnostic reports
    labelled: int = 0
    reported: int = 0  # diagnostics (of distinct lines and category)
    right: int = 0  # of them, those at a labelled breaker
    loops_labelled: int = 0
    loops_found: int = 0
    loops_extra: int = 0
    verdicts_right: int = 0
    train_loops: int = 0  # labelled training loops
    train_possible: int = 0  # of them, those the label says can be captured whole or in part
    train_rewritten: int = 0  # labelled training loops `graphify rewrite` rewrites (whole or model only)
    possible_rewritten: int = 0
    refused: int = 0  # labelled training loops found and left unchanged
    refused_with_real_blocker: int = 0  # of them, those whose stated reasons include a labelled breaker
    over_promised: int = 0  # captured whole, though labelled not-capturable
    graphed_beside_blockers: int = 0  # the model graphed alone, in a loop labelled not-capturable
    missed: list[str] = field(default_factory=list)
    false_alarms: list[str] = field(default_factory=list)
    loop_notes: list[str] = field(default_factory=list)

    def add(self, other: "Score") -> None:
        for name in self.__dataclass_fields__:
            if not isinstance(getattr(self, name), int):
                continue
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def recall(self) -> float:
        return self.hits / self.labelled if self.labelled else 1.0

    @property
    def precision(self) -> float:
        return self.right / self.reported if self.reported else 1.0


def load_labels(path: Path) -> dict:
    with path.open("rb") as handle:
        return tomllib.load(handle)


_POSSIBLE = {"capturable", "capturable-after-rewrite", "partially-capturable"}


def score_rewrites(score: Score, labels: dict, diagnostics, outcomes: list[tuple[int, bool, list[str], bool]]) -> None:
    """outcomes: (line, rewritten, reasons, model only) of each loop `graphify rewrite` saw. A refusal names its real
    blocker when one of its reason codes is reported on a line the labels mark with that code's category."""
    blocked = {(b["line"], b["category"]) for b in labels.get("breaker", [])}
    real = {code for lines, category, code in diagnostics if any((line, category) in blocked for line in lines)}
    by_line = {line: (rewritten, reasons, model_only) for line, rewritten, reasons, model_only in outcomes}
    for loop in labels.get("loop", []):
        if loop.get("ambiguous") or loop["kind"] != "train":
            continue
        score.train_loops += 1
        possible = loop["verdict"] in _POSSIBLE
        score.train_possible += possible
        rewritten, reasons, model_only = by_line.get(loop["line"], (False, None, False))
        if rewritten:
            score.train_rewritten += 1
            score.possible_rewritten += possible
            if loop["verdict"] == "not-capturable":
                score.graphed_beside_blockers += model_only
                score.over_promised += not model_only
                if not model_only:
                    score.loop_notes.append(f"loop {loop['line']}: captured whole, labelled not-capturable")
        elif reasons is not None:
            score.refused += 1
            if possible:
                score.loop_notes.append(
                    f"loop {loop['line']}: left unchanged ({', '.join(reasons) or 'no code'}), labelled {loop['verdict']}"
                )
            score.refused_with_real_blocker += any(code in real for code in reasons)
            if not any(code in real for code in reasons):
                score.loop_notes.append(f"loop {loop['line']}: refused for {', '.join(reasons) or 'no code'}, no labelled breaker")


def score_file(labels: dict, diagnostics: list[tuple[int, str, str]], loops: list[tuple[int, str, str]], outcomes=()) -> Score:
    """diagnostics: (line, category, code); loops: (line, kind, verdict), as `check` reports them;
    outcomes: (line, rewritten, reasons, model only), as `rewrite` decides."""
    score = Score()
    score_rewrites(score, labels, diagnostics, list(outcomes))
    wanted = {(b["line"], b["category"]) for b in labels.get("breaker", []) if not b.get("ambiguous")}
    tolerated = {(b["line"], b["category"]) for b in labels.get("breaker", []) if b.get("ambiguous")}
    codes: dict[tuple[tuple[int, ...], str], str] = {}
    for lines, category, code in diagnostics:
        codes.setdefault((lines, category), code)
    covered = {(line, category) for lines, category in codes for line in lines}
    reported = [(lines, category) for lines, category in codes if not {(line, category) for line in lines} <= tolerated]
    right = [(lines, category) for lines, category in reported if any((line, category) in wanted for line in lines)]
    score.labelled, score.reported, score.right = len(wanted), len(reported), len(right)
    score.hits = len(wanted & covered)
    score.missed = [f"{line}: {category}" for line, category in sorted(wanted - covered)]
    score.false_alarms = [
        f"{lines[-1]}: {category} ({codes[lines, category]})"
        for lines, category in sorted(set(reported) - set(right), key=lambda k: (k[0][-1], k[1]))
        if not any((line, category) in tolerated for line in lines)
    ]
    found = {line: (kind, verdict) for line, kind, verdict in loops}
    labelled_loops = [lp for lp in labels.get("loop", []) if not lp.get("ambiguous")]
    score.loops_labelled = len(labelled_loops)
    for loop in labelled_loops:
        if loop["line"] not in found:
            score.loop_notes.append(f"loop {loop['line']} ({loop['kind']}) not found")
            continue
        score.loops_found += 1
        verdict = found[loop["line"]][1]
        if verdict == loop["verdict"]:
            score.verdicts_right += 1
        else:
            score.loop_notes.append(f"loop {loop['line']}: {verdict}, labelled {loop['verdict']}")
    known = {lp["line"] for lp in labels.get("loop", [])}
    for line in sorted(set(found) - known):
        score.loops_extra += 1
        score.loop_notes.append(f"loop {line} ({found[line][0]}) reported, not labelled")
    return score


def check_file(path: Path):
    from graphify.config import Settings
    from graphify.engine import analyze_source

    from graphify.notebooks import load_module

    source, _ = load_module(str(path))  # a notebook: its code cells joined, the lines labels count
    report = analyze_source(source, str(path), Settings())
    # labels mark the flagged code itself: for a breaker of a called function, the helper's lines (check
    # reports it at the call); either one counts
    diagnostics = [
        (tuple(dict.fromkeys([d.line, *(line for _, line in d.flagged())])), d.rule.category, d.rule.code) for d in report.diagnostics
    ]
    loops = [(lp.line, lp.kind, lp.verdict.value) for lp in report.loops]
    from graphify.rewrite import rewrite_source

    rewrite = rewrite_source(source, str(path), Settings())
    outcomes = [(o.line, o.rewritten, [r for r in o.reasons if r.startswith("GFY")], o.model_only) for o in rewrite.outcomes]
    return diagnostics, loops, outcomes


def _ratio(part: int, whole: int) -> str:
    return f"{part / whole:.2f} ({part}/{whole})" if whole else "n/a"


def render(rows: list[tuple[str, Score]], total: Score, details: bool, seconds: float) -> str:
    lines = [
        "# `graphify check` on the labelled real-world suite",
        "",
        f"{len(rows)} scripts; labels: bench/real/labels/ (rules: bench/real/LABELS.md); analysis time {seconds:.1f} s in one process.",
        "",
        "| | value |",
        "| --- | --- |",
        f"| breaker recall (line+category) | {_ratio(total.hits, total.labelled)} |",
        f"| diagnostic precision | {_ratio(total.right, total.reported)} |",
        f"| loops found | {_ratio(total.loops_found, total.loops_labelled)} |",
        f"| loops reported, not labelled | {total.loops_extra} |",
        f"| verdicts right (of loops found) | {_ratio(total.verdicts_right, total.loops_found)} |",
        f"| training loops rewritten (whole or model only) | {_ratio(total.train_rewritten, total.train_loops)} |",
        f"| of those labelled capturable in whole or part | {_ratio(total.possible_rewritten, total.train_possible)} |",
        f"| refusals naming a labelled breaker | {_ratio(total.refused_with_real_blocker, total.refused)} |",
        f"| captured whole though labelled not-capturable | {total.over_promised} |",
        f"| model graphed alone in loops labelled not-capturable | {total.graphed_beside_blockers} |",
        "",
        "| script | recall | precision | loops found | verdicts right |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, s in rows:
        lines.append(
            f"| {name} | {_ratio(s.hits, s.labelled)} | {_ratio(s.right, s.reported)} | "
            f"{s.loops_found}/{s.loops_labelled} | {s.verdicts_right}/{s.loops_found} |"
        )
    if details:
        lines += ["", "## Differences", ""]
        for name, s in rows:
            notes = [f"missed {m}" for m in s.missed] + [f"false alarm {f}" for f in s.false_alarms] + s.loop_notes
            if notes:
                lines.append(f"* **{name}**: " + "; ".join(notes))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=DEFAULT_DEST)
    parser.add_argument("--details", action="store_true", help="list every difference")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    rows, total, started = [], Score(), time.perf_counter()
    for entry in load_manifest():
        label_file = LABELS / f"{entry['id']}.toml"
        if (args.only is not None and entry["id"] not in args.only) or not label_file.is_file():
            continue
        source = restored_path(entry, args.src)
        if not source.is_file():
            print(f"{source}: missing; run python bench/real/restore.py first", file=sys.stderr)
            return 2
        score = score_file(load_labels(label_file), *check_file(source))
        rows.append((entry["id"], score))
        total.add(score)
    text = render(rows, total, args.details, time.perf_counter() - started)
    print(text, end="")
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
