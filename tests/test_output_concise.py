"""What `graphify check` prints, through the real engine: one line per breaker by default (`full` adds the
code frame and fix), each breaker once (a DataLoader or DDP model several loops share, the same code
twice at one place), and a breaker inside a function the loop calls located at that call, with the
helper's line as related information in every format."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixture_cases import CHECK, cases, entry_script

import graphify.cli as cli
from graphify.config import Settings
from graphify.engine import analyze_source
from graphify.files import discover, read_source


def run(*args: str):
    return CliRunner().invoke(cli.cli, list(args))


def write(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def line_of(path: str, text: str) -> int:
    return next(i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if text in line)


SHARED = """\
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    for epoch in range(3):
        for x, y in loader:
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            for x, y in loader:
                out = model(x)
"""

HELPER = """\
import torch
import torch.nn as nn

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]


def check_finite(t):
    if t.abs().max() > 100:
        raise RuntimeError("diverged")
    if t.isnan().any():
        raise RuntimeError("nan")


for x, y in loader:
    out = model(x)
    check_finite(out)
    loss = ((out - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

REFUSED_IN_HELPER = """\
import torch
import torch.nn as nn

model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
loader = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(4)]
history = []


def track(out, y):
    history.append((out.argmax(1) == y).float().mean())
    history.append(out.mean())
    return out


for x, y in loader:
    out = track(model(x), y)
    loss = criterion(out, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


# --- concise by default, full on request -------------------------------------------------------------


def test_default_is_one_line_per_breaker_and_full_adds_frame_and_fix(tmp_path):
    path = write(tmp_path, "train.py", HELPER)
    concise = run("check", path)
    assert concise.exit_code == 1
    lines = concise.stdout.splitlines()
    assert lines[0] == f"{path}:16: train loop at module level: partially-capturable (GFY101)"
    assert lines[-1].startswith("1 loop, ") and lines[-2] == ""
    breakers = [line for line in lines[1:-2] if line]
    assert breakers and all(line.startswith(f"{path}:") for line in breakers)
    assert " | " not in concise.stdout and "fix:" not in concise.stdout
    assert run("check", "--output-format", "concise", path).stdout == concise.stdout
    assert run("check", "--format", "text", path).stdout == concise.stdout

    full = run("check", "--output-format", "full", path).stdout
    assert f"   {line_of(path, 'check_finite(out)')} |     check_finite(out)" in full
    assert "  fix: " in full
    assert "  note: in helper `check_finite` at " in full


def test_statistics_take_the_text_names(tmp_path):
    path = write(tmp_path, "train.py", HELPER)
    for fmt in ("concise", "full", "text"):
        assert run("check", "--statistics", "--output-format", fmt, path).stdout == "1  GFY101  tensor-condition\n"


# --- each breaker once ----------------------------------------------------------------------------------


def test_a_breaker_shared_by_loops_is_reported_once_naming_every_loop(tmp_path):
    path = write(tmp_path, "ddp.py", SHARED)
    train, infer = line_of(path, "for x, y in loader:"), 18
    doc = json.loads(run("check", "--output-format", "json", path).stdout)
    by_code = {}
    for d in doc["diagnostics"]:
        by_code.setdefault(d["code"], []).append(d)
    assert len(by_code["GFY613"]) == 1 and len(by_code["GFY251"]) == 1
    for code in ("GFY613", "GFY251"):
        assert [lp["line"] for lp in by_code[code][0]["loops"]] == [train, infer]
        assert by_code[code][0]["loop_line"] == train

    text = run("check", path).stdout
    assert text.count("GFY613") == 1
    assert f"GFY613 `DDP(nn.Linear(4, 1))` runs DDP hooks in the step (also the loop at {path}:{infer})" in text
    sarif = json.loads(run("check", "--output-format", "sarif", path).stdout)["runs"][0]["results"]
    assert [r["properties"]["loopLines"] for r in sarif if r["ruleId"] == "GFY613"] == [[train, infer]]


def test_one_code_at_one_place_is_one_diagnostic(tmp_path):
    """Two tensor branches of a helper, reached through one call in the loop: one GFY101 at that call,
    naming both lines of the helper."""
    path = write(tmp_path, "train.py", HELPER)
    doc = json.loads(run("check", "--output-format", "json", path).stdout)
    (d,) = [d for d in doc["diagnostics"] if d["code"] == "GFY101"]
    assert [r["line"] for r in d["related"]] == [line_of(path, "if t.abs()"), line_of(path, "if t.isnan()")]


@pytest.mark.parametrize("case", cases(), ids=lambda p: p.name)
def test_no_fixture_reports_a_code_twice_at_one_place(case):
    settings = Settings(select=["ALL"])
    files, _ = discover([str(case)], settings)
    for path in files:
        report = analyze_source(read_source(path), path, settings)
        places = [(d.path, d.line, d.column, d.code) for d in report.diagnostics]
        assert len(places) == len(set(places)), sorted(p for p in places if places.count(p) > 1)


# --- at the call in the loop, the helper's line related ------------------------------------------------


def test_a_breaker_in_a_helper_stands_at_the_call_in_the_loop(tmp_path):
    path = write(tmp_path, "train.py", HELPER)
    call, first = line_of(path, "check_finite(out)"), line_of(path, "if t.abs()")
    second = line_of(path, "if t.isnan()")

    doc = json.loads(run("check", "--output-format", "json", path).stdout)
    (d,) = doc["diagnostics"]
    assert (d["line"], d["column"]) == (call, 5)
    assert d["related"][0] == {
        "path": path,
        "cell": None,
        "line": first,
        "column": 5,
        "end_line": first + 1,
        "end_column": 39,
        "message": "in helper `check_finite`",
    }

    text = run("check", path).stdout
    assert (
        f"{path}:{call}:5: GFY101 branch on tensor value `t.abs().max() > 100` (in helper `check_finite` at {path}:{first}, {path}:{second})"
        in text
    )

    result = json.loads(run("check", "--output-format", "sarif", path).stdout)["runs"][0]["results"][0]
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == call
    related = result["relatedLocations"]
    assert [r["physicalLocation"]["region"]["startLine"] for r in related] == [first, second]
    assert related[0]["message"]["text"] == "in helper `check_finite`"

    github = run("check", "--output-format", "github", path).stdout
    assert f"line={call},col=5," in github and f"(in helper `check_finite` at {path}:{first}, {path}:{second})" in github


def test_a_refusal_in_a_helper_is_told_the_same_way(tmp_path):
    """The planner's reasons (GFY70x) found in a called function stand at the call too, each helper line
    related, and the message no longer carries the helper's place itself."""
    path = write(tmp_path, "train.py", REFUSED_IN_HELPER)
    doc = json.loads(run("check", "--output-format", "json", path).stdout)
    (d,) = [d for d in doc["diagnostics"] if d["code"] == "GFY703"]
    assert d["line"] == line_of(path, "out = track(")
    assert [r["line"] for r in d["related"]] == [line_of(path, "history.append((out"), line_of(path, "history.append(out.mean")]
    assert "(in `" not in d["message"]


def test_a_suppression_at_the_call_covers_the_helpers_breaker(tmp_path):
    source = HELPER.replace("    check_finite(out)\n", "    check_finite(out)  # graphify: ignore[GFY101]\n")
    path = write(tmp_path, "train.py", source)
    assert json.loads(run("check", "--output-format", "json", path).stdout)["diagnostics"] == []
    at_helper = HELPER.replace("    if t.abs().max() > 100:\n", "    if t.abs().max() > 100:  # graphify: ignore[GFY101]\n")
    path = write(tmp_path, "train2.py", at_helper)
    (d,) = json.loads(run("check", "--output-format", "json", path).stdout)["diagnostics"]
    assert [r["line"] for r in d["related"]] == [line_of(path, "if t.isnan()")]


def test_a_helper_in_a_sibling_module_is_related_by_its_own_path():
    case = CHECK / "sibling_step_module"
    path = str(entry_script(case))
    doc = json.loads(run("check", "--output-format", "json", path).stdout)
    helpers = [d for d in doc["diagnostics"] if d["related"]]
    assert helpers and all(d["path"] == path for d in helpers)
    assert {Path(r["path"]).name for d in helpers for r in d["related"]} == {"steps.py"}
