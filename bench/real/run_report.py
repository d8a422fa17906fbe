"""The table of bench/real/run.py: per script and in total, from its JSON.

Rewrite coverage counts every loop graphify finds in the 42 scripts (from bench/real/src, restored by
restore.py; no GPU needed); verify and timing columns come from the GPU run.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from graphify.verify.timing import AFTER_STARTUP
from restore import DEFAULT_DEST, load_manifest, restored_path
from run import FALLBACK

CAPTURABLE_LABELS = {"capturable-after-rewrite", "capturable"}


def _static_loops() -> dict[str, list[dict]]:
    from run import loop_outcomes

    return {
        entry["id"]: loop_outcomes(entry["id"], path)[0]
        for entry in load_manifest()
        for path in [restored_path(entry, DEFAULT_DEST)]
        if path.exists()
    }


def _refusal_truth(loop: dict) -> str:
    if loop["rewritten"]:
        return ""
    if loop["label"] is None:
        return "unlabelled"
    return "disputed" if loop["label"] in CAPTURABLE_LABELS else "true"


def _partial(loop: dict) -> str:
    return " (model only)" if loop.get("model_only") else ""


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b else "—"


def _row(record: dict, loops: list[dict], device: str) -> str:
    rewritten = ", ".join(f"{lp['line']} {lp['kind'][:5]}{_partial(lp)}" for lp in loops if lp["rewritten"]) or "—"
    refused = (
        "; ".join(f"{lp['line']} {lp['kind'][:5]} {'/'.join(lp['codes'])} ({_refusal_truth(lp)})" for lp in loops if not lp["rewritten"])
        or "—"
    )
    if "skipped" in record:
        return f"| {record['id']} | {rewritten} | {refused} | not run: {record['skipped']} | | |"
    verify = record.get("verify")
    if verify is None:
        at_run = [lp for lp in record.get("loops", []) if not lp["rewritten"] and lp["kind"] == "train"]
        if rewritten != "—" and at_run and not any(lp["rewritten"] for lp in record.get("loops", [])):
            # the static columns read the script alone; laid out with the files it imports, the run refused it
            codes = "; ".join(f"{lp['line']} {lp['kind'][:5]} {'/'.join(lp['codes'])}" for lp in at_run)
            return f"| {record['id']} | {rewritten} | {refused} | nothing to verify: refused where its own modules are beside it ({codes}) | | |"
        return f"| {record['id']} | {rewritten} | {refused} | nothing to verify | | |"
    step = verify.get("speedup")
    state = verify["status"] + (f" (loop {verify['loop']})" if verify.get("loop") else "")
    if verify["status"] != "passed" and verify.get("message"):
        state += f": {verify['message'][:90]}"
    if record.get("device", device) != device:  # a later run of this script alone, on another card
        state += f" (on {record['device']})"
    fallback = next((n.split("graphify: ", 1)[-1] for n in verify.get("runtime_notes") or [] if FALLBACK in n), None)
    if fallback:
        state += f"; the runtime fell back to eager ({fallback[:110]})"
    whole = record.get("whole_run")
    eager, graphed = (whole or {}).get("eager", {}), (whole or {}).get("graphify", {})
    if whole is None:
        run_cell = "not timed (the script does not end soon)"
    elif eager.get("ok") and graphed.get("ok"):
        run_cell = f"{eager['seconds']:.1f} s → {graphed['seconds']:.1f} s ({_ratio(eager['seconds'], graphed['seconds'])})"
        if "runs" in eager:
            run_cell += f"{', within the spread' if _within_spread(whole) else ''} (runs: {_runs(eager)} → {_runs(graphed)})"
        if graphed.get("fell_back"):
            run_cell += ", fell back to eager"
    else:
        run_cell = "eager: " + (eager.get("why") or "ok") + "; graphify: " + (graphed.get("why") or "ok")
    cpu = "" if record.get("cuda_used", True) else " (CPU script)"
    return f"| {record['id']} | {rewritten} | {refused} | {state}{cpu} | {f'{step:.2f}×' if step else '—'} | {run_cell} |"


def _runs(timed: dict) -> str:
    return "/".join(f"{t:.1f}" for t in timed["runs"])


def _within_spread(whole: dict) -> bool:
    """The two versions' times overlap: the difference of the medians is run-to-run noise."""
    eager, graphed = whole["eager"].get("runs"), whole["graphify"].get("runs")
    return bool(eager and graphed) and min(graphed) <= max(eager) and min(eager) <= max(graphed)


SPLIT_PARTS = AFTER_STARTUP  # verify's parts of a run after its start-up, in order
SPLIT_LABELS = ("data", "copies", "step", "reads", "eval", "rest")


def _split_cell(split: dict | None) -> str:
    """A version's run after start-up: seconds, then each part's share."""
    if not split:
        return "—"
    seconds = split["seconds"]
    after = sum(seconds[p] for p in SPLIT_PARTS)
    if after <= 0:
        return "—"
    shares = " ".join(f"{label} {seconds[p] / after:.0%}" for p, label in zip(SPLIT_PARTS, SPLIT_LABELS) if seconds[p] / after >= 0.005)
    pageable = split.get("h2d_pageable_s") or 0.0
    note = f" (pageable {pageable / after:.0%})" if pageable / after >= 0.005 else ""
    return f"{after:.2f} s: {shares}{note}"


def _bound(verify: dict) -> str:
    """What bounds the original's run (the time verdict's first words), and whether the rewrite's step ran eagerly."""
    run = (verify.get("time_verdict") or "").split(":", 1)[0] or "—"
    return run + ("; the runtime left the step eager" if "eagerly" in (verify.get("step_verdict") or "") else "")


def time_split_table(records: list[dict]) -> list[str]:
    """Original against rewrite, for each script verify split: where the run after start-up goes, the step's
    speedup and the whole run's."""
    lines = [
        "| script | bound by | original, after start-up | rewrite, after start-up | step | after start-up | whole run |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for record in records:
        verify = record.get("verify") or {}
        split = verify.get("time_split") or {}
        if not split.get("original"):
            continue
        before, after = (sum(s["seconds"][p] for p in SPLIT_PARTS) if s else None for s in (split.get("original"), split.get("rewrite")))
        whole = record.get("whole_run") or {}
        eager, graphed = whole.get("eager", {}), whole.get("graphify", {})
        whole_cell = _ratio(eager.get("seconds"), graphed.get("seconds")) if eager.get("ok") and graphed.get("ok") else "—"
        step = verify.get("speedup")
        lines.append(
            f"| {record['id']} | {_bound(verify)} | {_split_cell(split.get('original'))} | {_split_cell(split.get('rewrite'))}"
            f" | {f'{step:.2f}×' if step else '—'} | {_ratio(before, after)} | {whole_cell} |"
        )
    return lines


def long_run_table(records: list[dict]) -> list[str]:
    """Whole runs at length, original against rewrite: every time, the medians' ratio, whether the two
    overlap; then the median ratio and the runs slower than eager beyond their spread."""
    lines = ["| script | data, arguments | eager, s | graphify, s | whole run | |", "| --- | --- | ---: | ---: | ---: | --- |"]
    ratios, slower = [], []
    for record in records:
        whole = record["whole_run"]
        eager, graphed = whole.get("eager", {}), whole.get("graphify", {})
        length = _length(record["long"])
        if not (eager.get("ok") and graphed.get("ok")):
            why = whole.get("skipped") or f"eager: {eager.get('why') or 'ok'}; graphify: {graphed.get('why') or 'ok'}"
            lines.append(f"| {record['id']} | {length} | | | — | {why} |")
            continue
        ratio = eager["seconds"] / graphed["seconds"]
        ratios.append(ratio)
        spread = _within_spread(whole)
        if ratio < 1 and not spread:
            slower.append(record["id"])
        note = ", ".join(filter(None, ["within the spread" if spread else "", "fell back to eager" if graphed.get("fell_back") else ""]))
        lines.append(f"| {record['id']} | {length} | {_runs(eager)} | {_runs(graphed)} | {ratio:.2f}× | {note} |")
    if ratios:
        lines += [
            "",
            f"median whole run {statistics.median(ratios):.2f}× over {len(ratios)} scripts ({min(ratios):.2f}× to {max(ratios):.2f}×); "
            f"slower than eager beyond the spread: {', '.join(slower) or 'none'}",
        ]
    return lines


def _length(spec: dict) -> str:
    data = "; ".join(", ".join(f"{k} {v}" for k, v in d.items() if k not in ("make", "at")) or d["make"] for d in spec.get("data", []))
    return " ".join(filter(None, [data, " ".join(spec.get("args", []))])) or "as `run`"


def summary(records: list[dict], static: dict[str, list[dict]]) -> list[str]:
    loops = [lp for found in static.values() for lp in found]
    train = [lp for lp in loops if lp["kind"] == "train"]
    # a model-only rewrite of a loop labelled not capturable: the models' forwards (in files the suite does
    # not hold) stop the capture at run time, and the runtime leaves them eager: no gain to count
    against_label = [lp for lp in train if lp["rewritten"] and lp["label"] == "not-capturable"]
    rewritten = [lp for lp in train if lp["rewritten"] and lp not in against_label]
    refused = [lp for lp in loops if not lp["rewritten"]]
    truth = [_refusal_truth(lp) for lp in refused]
    verified = [r["verify"] for r in records if r.get("verify") and r.get("cuda_used")]
    on_cpu = [r["verify"] for r in records if r.get("verify") and not r.get("cuda_used")]
    passed = [v for v in verified if v["status"] == "passed"]
    fell_back = [v for v in verified if any(FALLBACK in n for n in v.get("runtime_notes") or [])]
    no_gain = [v for v in fell_back if any("no gain expected" in n for n in v["runtime_notes"])]
    speedups = [v["speedup"] for v in passed if v.get("speedup") and v not in fell_back]  # nothing was captured
    whole = [r["whole_run"] for r in records if r.get("whole_run") and r.get("cuda_used")]
    crashes = [w for w in whole if w["eager"].get("ok") and not w["graphify"].get("ok")]
    whole_ratios = [w["eager"]["seconds"] / w["graphify"]["seconds"] for w in whole if w["eager"].get("ok") and w["graphify"].get("ok")]
    median = f"{statistics.median(speedups):.2f}×" if speedups else "—"
    median_whole = f"{statistics.median(whole_ratios):.2f}× (min {min(whole_ratios):.2f}×)" if whole_ratios else "—"
    timed = [w for r in records for w in [r.get("whole_run") or {}] if w.get("eager", {}).get("runs") and w.get("graphify", {}).get("runs")]
    slower = [w for w in timed if w["graphify"]["seconds"] > w["eager"]["seconds"] and not _within_spread(w)]
    return [
        "| | value |",
        "| --- | --- |",
        f"| training loops rewritten (of those found) | {len(rewritten)}/{len(train)}"
        f" ({sum(bool(_partial(lp)) for lp in rewritten)} of them the model only) |",
        f"| training loops rewritten where the hand label says nothing can be graphed (not counted above) | {len(against_label)} |",
        f"| all loops rewritten | {sum(lp['rewritten'] for lp in loops)}/{len(loops)} |",
        f"| refusals true (hand label: not capturable whole) | {truth.count('true')}/{len(refused)}"
        f" ({truth.count('disputed')} disputed, {truth.count('unlabelled')} unlabelled) |",
        f"| rewrites verified equivalent on the GPU (teacher-forced) | {len(passed)}/{len(verified)}"
        f" ({len(fell_back)} ran eagerly: {len(fell_back) - len(no_gain)} after a failed capture, {len(no_gain)} with no gain expected) |",
        f"| CPU-only scripts verified equivalent (exact) | {sum(v['status'] == 'passed' for v in on_cpu)}/{len(on_cpu)} |",
        f"| rewritten scripts that crashed where eager ran | {len(crashes)} |",
        f"| step speedup (verify), median | {median}" + (f" (min {min(speedups):.2f}×)" if speedups else "") + " |",
        f"| whole-run speedup, median | {median_whole} |",
        f"| whole runs slower than eager beyond run-to-run spread (CPU scripts too) | {len(slower)}/{len(timed)} |",
    ]


def write_report(json_path: Path, out: Path) -> int:
    doc = json.loads(json_path.read_text())
    records = sorted(doc["records"], key=lambda r: [e["id"] for e in load_manifest()].index(r["id"]))
    static = _static_loops()
    lines = [
        "# The real-world suite on the GPU",
        "",
        f"{len(static)} scripts ({doc['device']}). Scripts, commits and synthetic-data runs: bench/real/manifest.toml,"
        " bench/real/runs.toml; made by `python bench/real/run.py run` then `report`.",
        "",
    ]
    lines += summary(records, static)
    lines += [
        "",
        "| script | rewritten loops | refused loops (codes; refusal true?) | verify | step speedup | whole run, eager → graphify |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    from run import load_runs

    runs, not_run = load_runs()
    with_run = {run["id"] for run in runs}
    seen = {record["id"] for record in records}
    records += [
        {
            "id": e["id"],
            "skipped": not_run.get(e["id"], "a run in runs.toml, not run on the GPU yet" if e["id"] in with_run else "no run in runs.toml"),
        }
        for e in load_manifest()
        if e["id"] not in seen
    ]
    lines += [_row(record, static.get(record["id"], record.get("loops", [])), doc["device"]) for record in records]
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())
    return 0
