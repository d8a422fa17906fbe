"""Golden outputs of every format for one hand-built Report.

Regenerate the golden files with GRAPHIFY_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import graphify.rules
from graphify.model import (
    Diagnostic,
    FileError,
    LoopReport,
    Related,
    Report,
    Rule,
    Severity,
    Verdict,
)
from graphify.reporters import github, render, rule_url, sarif, statistics, text

GOLDEN = Path(__file__).parent / "golden"

ITEM = Rule("GFY001", "tensor-item", "host-sync", Severity.ERROR, "`.item()` waits for the GPU", True)
NONZERO = Rule("GFY008", "data-dependent-output-size", "host-sync", Severity.ERROR, "`nonzero` sizes its output from data", False)
SCHED = Rule("GFY402", "scheduler-step-per-iteration", "lr-scheduler", Severity.WARNING, "a scheduler step with a Python LR", True)
LOADER = Rule("GFY251", "loader-without-drop-last", "dynamic-shape", Severity.WARNING, "the last batch can be smaller", True)
RULES = [ITEM, NONZERO, LOADER, SCHED]

SOURCES = {
    "train.py": [
        "import torch",
        "def main(model, loader, opt):",
        "    for x, y in loader:",
        "        loss = model(x, y)",
        "        total += loss.item()",
        "        idx = torch.nonzero(",
        "            mask)",
        "\tlog('%d, done: 100%', loss.item())",
        "",
        "for batch in loader:",
        "    model(batch)",
    ],
    "steps.py": ["def helper(out):", "    return out.item()"],
    "my dir/eval.py": ["", "", "", "for step in range(10):", "    sched.step()"],
}


TAB_COL = SOURCES["train.py"][7].index("loss.item()") + 1  # 1-based; the tab counts as one column


def diag(path, line, col, end_line, end_col, rule, message, fix, loop_path="train.py", loop_line=3, related=(), loops=()):
    return Diagnostic(path, line, col, end_line, end_col, rule, message, fix, loop_path, loop_line, rule.rewritable, related, loops)


def sample_report() -> Report:
    return Report(
        diagnostics=[
            # deliberately out of order: every reporter sorts
            diag("train.py", 6, 15, 7, 18, NONZERO, "`torch.nonzero` output size depends on data", "use a fixed-size mask instead"),
            diag("train.py", 5, 18, 5, 29, ITEM, "`loss.item()` waits for the GPU", "read it after the step"),
            diag("train.py", 8, TAB_COL, 8, TAB_COL + 11, ITEM, "`loss.item()` in a 100% string, with: commas", "log after the step"),
            diag("steps.py", 2, 12, 2, 22, ITEM, "`out.item()` waits for the GPU", "return the tensor"),
            diag("my dir/eval.py", 5, 5, 5, 17, SCHED, "scheduler step every iteration", "use a tensor LR", "my dir/eval.py", 4),
            # in a function the loop calls: told at the call in the loop, the helper's line related
            diag(
                "train.py",
                11,
                5,
                11,
                17,
                ITEM,
                "`out.item()` waits for the GPU",
                "return the tensor",
                loop_line=10,
                related=(Related("steps.py", 2, 12, 2, 22, "in helper `helper`"),),
            ),
            # built once, used by two loops: one diagnostic naming both
            diag(
                "train.py",
                2,
                25,
                2,
                31,
                LOADER,
                "`loader` has no `drop_last=True`",
                "pass `drop_last=True`",
                loops=(("train.py", 3), ("train.py", 10)),
            ),
        ],
        loops=[
            LoopReport("train.py", 10, 11, "inference", None, Verdict.CAPTURABLE, []),
            LoopReport("train.py", 3, 8, "train", "main", Verdict.NOT_CAPTURABLE, ["GFY008"]),
            LoopReport("my dir/eval.py", 4, 5, "train", "Trainer.fit", Verdict.AFTER_REWRITE, []),
        ],
        errors=[
            FileError("bad.py", "syntax error at line 3, column 7: unexpected token"),
            FileError("blob.py", "binary file (contains NUL bytes), not Python source"),
        ],
        files_checked=4,
    )


@pytest.fixture(autouse=True)
def fake_docs(monkeypatch):
    monkeypatch.setattr(graphify.rules, "rule_doc", lambda code: f"# {code}\n\nThe documentation of {code}.\n")


def outputs() -> dict[str, str]:
    report = sample_report()
    return {
        "report.txt": text.render(report, source_lines=lambda p: SOURCES.get(p)),
        "report.full.txt": text.render(report, full=True, source_lines=lambda p: SOURCES.get(p)),
        "report.color.txt": text.render(report, color=True, source_lines=lambda p: SOURCES.get(p)),
        "report.full.color.txt": text.render(report, full=True, color=True, source_lines=lambda p: SOURCES.get(p)),
        "report.json": render(report, "json"),
        "report.sarif": sarif.render(report, rules=RULES),
        "report.github": github.render(report),
        "report.statistics.txt": statistics.render(report),
        "report.statistics.json": statistics.render(report, as_json=True),
    }


@pytest.mark.parametrize("name", sorted(outputs()))
def test_golden(name):
    actual = outputs()[name]
    golden = GOLDEN / name
    if os.environ.get("GRAPHIFY_UPDATE_GOLDEN"):
        golden.write_text(actual, encoding="utf-8")
    assert actual == golden.read_text(encoding="utf-8")


def test_text_without_sources_and_empty_report():
    out = text.render(sample_report(), full=True, source_lines=lambda p: None)
    assert "   5 |" not in out and "train.py:5:18: GFY001 `loss.item()` waits for the GPU\n  fix: read it after the step" in out
    assert text.render(Report()) == "0 loops, 0 capturable, 0 capturable after rewrite, 0 not capturable, 0 breakers\n"


def test_text_reads_sources_from_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("\n".join(SOURCES["train.py"]) + "\n")
    report = sample_report()
    assert text.render(report) == text.render(report, source_lines=lambda p: SOURCES.get(p) if p == "train.py" else None)


def test_same_position_in_every_format():
    report = sample_report()
    d = report.diagnostics[1]
    doc = json.loads(render(report, "json"))["diagnostics"]
    j = next(x for x in doc if x["path"] == d.path and x["line"] == d.line)
    assert (j["line"], j["column"], j["end_line"], j["end_column"]) == (5, 18, 5, 29)
    results = json.loads(sarif.render(report, rules=RULES))["runs"][0]["results"]
    locations = [r["locations"][0]["physicalLocation"] for r in results]
    region = next(loc["region"] for loc in locations if loc["artifactLocation"]["uri"] == "train.py" and loc["region"]["startLine"] == 5)
    assert region == {"startLine": 5, "startColumn": 18, "endLine": 5, "endColumn": 29}
    assert "file=train.py,line=5,col=18,endLine=5,endColumn=29::" in github.render(report)
    assert "train.py:5:18: GFY001" in text.render(report)


def test_json_schema_exact_keys():
    doc = json.loads(render(sample_report(), "json"))
    assert list(doc) == ["version", "diagnostics", "loops", "errors"]
    assert doc["version"] == 3
    assert list(doc["diagnostics"][0]) == [
        "path",
        "cell",
        "line",
        "column",
        "end_line",
        "end_column",
        "code",
        "name",
        "category",
        "severity",
        "message",
        "fix",
        "loop_line",
        "related",
        "loops",
    ]
    assert list(doc["loops"][0]) == ["path", "cell", "line", "end_line", "kind", "function", "verdict", "reasons"]
    assert list(doc["errors"][0]) == ["path", "message"]


def test_sarif_structure():
    doc = json.loads(sarif.render(sample_report(), rules=RULES))
    assert doc["version"] == "2.1.0"
    run = doc["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == ["GFY001", "GFY008", "GFY251", "GFY402"]
    assert rules[0]["fullDescription"]["text"].startswith("# GFY001")
    assert rules[0]["helpUri"] == rule_url("GFY001") and rules[0]["helpUri"].endswith("/graphify/rules/host_sync/gfy001_tensor_item.py")
    assert rules[3]["defaultConfiguration"] == {"level": "warning"}
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]}
    assert "my%20dir/eval.py" in uris
    assert run["invocations"][0]["executionSuccessful"] is False


def test_sarif_lists_every_registered_rule_by_default():
    doc = json.loads(sarif.render(Report()))
    ids = [r["id"] for r in doc["runs"][0]["tool"]["driver"]["rules"]]
    assert ids == [r.code for r in graphify.rules.all_rules()]
    assert doc["runs"][0]["invocations"][0]["executionSuccessful"] is True


def test_github_escaping_and_severity():
    out = github.render(sample_report()).splitlines()
    assert out[0].startswith("::warning title=graphify (GFY402),file=my dir/eval.py,line=5,")
    assert any(line.endswith("::`loss.item()` in a 100%25 string, with: commas") for line in out)
    assert out[-1] == "::error title=graphify,file=blob.py::binary file (contains NUL bytes), not Python source"
    assert all(re.match(r"::(error|warning|notice) ", line) for line in out)


def test_every_rule_url_names_a_file_of_the_repository():
    from graphify.reporters.common import REPOSITORY_URL, rule_path
    from graphify.rules import all_rules

    root = Path(__file__).resolve().parents[1]
    for r in all_rules():
        assert rule_url(r.code) == f"{REPOSITORY_URL}/blob/main/{rule_path(r.code)}"
        assert (root / rule_path(r.code)).is_file(), r.code
