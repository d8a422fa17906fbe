"""Jupyter notebooks: checked with diagnostics located by cell, rewritten cell by cell with outputs and
metadata kept, and the rewritten notebook's code trains as the original did.

The fixture fixtures/notebooks/train_classifier.ipynb carries the usual `# expect:` / `# loop:`
markers in its cells; its expected rewrite is train_classifier.rewritten.ipynb (regenerate with
GRAPHIFY_UPDATE_FIXTURES=1 and review the diff).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixture_cases import FIXTURES, _EXPECT, _LOOP

import graphify.cli as cli
from graphify.files import SourceError
from graphify.notebooks import CellSpanError, read_notebook

NOTEBOOKS = FIXTURES / "notebooks"
NOTEBOOK = NOTEBOOKS / "train_classifier.ipynb"
REWRITTEN = NOTEBOOKS / "train_classifier.rewritten.ipynb"
UPDATE = os.environ.get("GRAPHIFY_UPDATE_FIXTURES") == "1"


def run(*args, input=None):
    return CliRunner().invoke(cli.cli, list(args), input=input)


def notebook(*cells: str | tuple[str, str], **metadata) -> str:
    """A notebook's JSON text; a tuple is (cell_type, source)."""
    out = []
    for cell in cells:
        kind, source = cell if isinstance(cell, tuple) else ("code", cell)
        extra = {"execution_count": None, "outputs": []} if kind == "code" else {}
        out.append({"cell_type": kind, "metadata": {}, "source": source.splitlines(True), **extra})
    return json.dumps({"cells": out, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n"


def expected_by_cell(path: Path) -> tuple[set, set]:
    diagnostics, loops = set(), set()
    code_cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    for number, cell in enumerate(code_cells, 1):
        for line_no, line in enumerate("".join(cell["source"]).splitlines(), 1):
            if m := _EXPECT.search(line):
                diagnostics |= {(number, line_no, code.strip()) for code in m.group(1).split(",") if code.strip()}
            if m := _LOOP.search(line):
                loops.add((number, line_no, m.group(1), m.group(2)))
    return diagnostics, loops


def test_check_locates_diagnostics_and_loops_by_cell():
    result = run("check", "--format", "json", str(NOTEBOOK))
    doc = json.loads(result.stdout)
    diagnostics, loops = expected_by_cell(NOTEBOOK)
    assert {(d["cell"], d["line"], d["code"]) for d in doc["diagnostics"]} == diagnostics
    assert {(lp["cell"], lp["line"], lp["kind"], lp["verdict"]) for lp in doc["loops"]} == loops
    assert result.exit_code == 1


def test_text_sarif_and_github_name_the_cell():
    text = run("check", "--output-format", "full", str(NOTEBOOK)).stdout
    assert f"{NOTEBOOK}:cell 5:3: train loop in train_one_epoch(): capturable-after-rewrite" in text
    assert f"{NOTEBOOK}:cell 5:4:16: GFY301" in text
    assert "    4 |         x, y = x.to(device), y.to(device)" in text  # the snippet's gutter counts within the cell
    concise = run("check", str(NOTEBOOK)).stdout
    assert f"{NOTEBOOK}:cell 5:4:16: GFY301" in concise and " | " not in concise


def test_sarif_and_github_point_at_the_notebook_files_own_line():
    """Viewers of both show the .ipynb file: line 14 of cell 4 is line 104 of the JSON; the cell's own
    position leads the message and, in SARIF, is in the properties."""
    assert '"optimizer = torch.optim.AdamW(' in NOTEBOOK.read_text().splitlines()[103]
    sarif = json.loads(run("check", "--format", "sarif", str(NOTEBOOK)).stdout)
    result = next(r for r in sarif["runs"][0]["results"] if r["ruleId"] == "GFY401")
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": 104, "endLine": 104}
    assert result["message"]["text"].startswith("cell 4:14:13: `AdamW` built without")
    assert result["properties"]["cell"] == 4
    assert result["properties"]["cellRegion"] == {"startLine": 14, "startColumn": 13, "endLine": 14, "endColumn": 78}
    github = run("check", "--format", "github", str(NOTEBOOK)).stdout
    assert f"::error title=graphify (GFY401) cell 4,file={NOTEBOOK},line=104,endLine=104::cell 4:14:13: `AdamW`" in github


def test_a_notebook_read_from_standard_input_has_no_file_line_to_point_at():
    """Its text is not the file's (or there is no file): the annotation names the file and the cell only."""
    text = NOTEBOOK.read_text().replace('"import time\\n",', '"import time\\n",\n    "import os\\n",', 1)
    github = run("check", "--format", "github", "--stdin-filename", str(NOTEBOOK), "-", input=text).stdout
    assert f"::error title=graphify (GFY401) cell 4,file={NOTEBOOK}::cell 4:14:13: `AdamW`" in github
    sarif = json.loads(run("check", "--format", "sarif", "--stdin-filename", str(NOTEBOOK), "-", input=text).stdout)
    assert "region" not in sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]


def test_rewrite_matches_golden_and_keeps_everything_else():
    result = run("rewrite", str(NOTEBOOK))
    assert result.exit_code == 1
    assert f"--- a/{NOTEBOOK}:cell 5\n" in result.stdout
    assert "would capture as `train_step`" in result.stderr
    notebook = read_notebook(str(NOTEBOOK))
    from graphify.config import Settings
    from graphify.rewrite import rewrite_source

    text, changed = notebook.with_source(rewrite_source(notebook.source, str(NOTEBOOK), Settings()).code)
    if UPDATE:
        REWRITTEN.write_text(text)
    assert text == REWRITTEN.read_text()
    assert sorted(changed) == [1, 5, 7]
    before, after = json.loads(NOTEBOOK.read_text()), json.loads(text)
    for old, new in zip(before["cells"], after["cells"], strict=True):
        assert {k: v for k, v in old.items() if k != "source"} == {k: v for k, v in new.items() if k != "source"}
    assert before["metadata"] == after["metadata"]
    assert after["cells"][8]["source"][0] == "%%time\n"  # a cell magic stays first


def test_rewrite_in_place_then_check_passes(tmp_path):
    target = tmp_path / "train.ipynb"
    target.write_text(NOTEBOOK.read_text())
    assert run("rewrite", "--in-place", str(target)).exit_code == 1
    assert target.read_text() == REWRITTEN.read_text()
    assert run("rewrite", "--check", str(target)).exit_code == 0


def test_folder_walk_finds_notebooks_and_skips_checkpoints(tmp_path):
    (tmp_path / "nb.ipynb").write_text(NOTEBOOK.read_text())
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "nb-checkpoint.ipynb").write_text("{not json")
    doc = json.loads(run("check", "--format", "json", str(tmp_path)).stdout)
    assert {d["path"] for d in doc["diagnostics"]} == {str(tmp_path / "nb.ipynb")}
    assert doc["errors"] == []


def test_ipython_syntax_keeps_line_numbers():
    nb = read_notebook(
        "x.ipynb",
        notebook("%pip install timm\nimport torch\nfiles = !ls\nmodel?\nx = 1", "%%bash\necho hi\nls", "%%time\ny = 2 % 1"),
    )
    assert nb.source.splitlines() == ["pass", "import torch", "files = None", "pass", "x = 1", "", "", "", "", "y = 2 % 1"]
    assert nb.starts == [1, 6, 9]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not a Jupyter notebook: invalid JSON at line 1, column 2"),
        ('{"nbformat": 3, "worksheets": []}', "not a Jupyter notebook of format 4 (no `cells` list; nbformat 3)"),
        (notebook("import torch", "for x in y:\nprint(x)"), "cell 2: syntax error at line 2, column 1: expected an indented block"),
    ],
)
def test_bad_notebooks_give_one_line(text, message):
    with pytest.raises(SourceError) as info:
        read_notebook("x.ipynb", text)
    assert info.value.message.startswith(message)


def test_bad_notebook_on_the_command_line(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text(notebook("for x in y:\nprint(x)"))
    for command in ("check", "rewrite"):
        result = run(command, str(bad))
        assert result.exit_code == 2
        assert f"graphify: {bad}: cell 1: syntax error at line 2" in result.stderr
        assert "Traceback" not in result.output


def test_other_languages_are_not_checked():
    nb = read_notebook("r.ipynb", notebook("library(torch)\nfor (i in 1:10) print(i)", language_info={"name": "R"}))
    assert nb.source == ""


def test_stdin_notebook():
    result = run("check", "--format", "json", "--stdin-filename", "nb.ipynb", "-", input=NOTEBOOK.read_text())
    assert {d["cell"] for d in json.loads(result.stdout)["diagnostics"]} == {4, 5, 7}


def test_changes_across_cells_are_refused():
    nb = read_notebook("x.ipynb", notebook("a = 1\nb = 2", "c = 3", "%env X=1\nd = 4"))
    with pytest.raises(CellSpanError, match="cells 1 to 2"):
        nb.with_source("a = 1\nX\npass\nd = 4\n")
    with pytest.raises(CellSpanError, match="IPython syntax in cell 3"):
        nb.with_source("a = 1\nb = 2\nc = 3\nimport os\nd = 4\n")
    _, changed = nb.with_source("import os\na = 1\nb = 2\nc = 3\npass\nd = 4\n")
    assert changed == {1: ("a = 1\nb = 2", "import os\na = 1\nb = 2")}


def test_verify_refuses_notebooks(tmp_path):
    result = run("verify", str(NOTEBOOK))
    assert result.exit_code == 2 and "export the notebook first" in result.stderr


@pytest.mark.cuda
def test_rewritten_notebook_captures_on_the_gpu():
    """The rewritten notebook's cells, run top to bottom on CUDA: both loops capture (no fallback)."""
    probe = (
        "import sys, torch\nfrom graphify.notebooks import read_notebook\n"
        "exec(compile(read_notebook(sys.argv[1]).source, sys.argv[1], 'exec'), globals())\n"
        "assert device.type == 'cuda' and train_one_epoch is not None\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(REWRITTEN)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "GraphifyFallbackWarning" not in done.stderr and "accuracy" in done.stdout, done.stderr[-2000:]


@pytest.mark.slow
def test_rewritten_notebook_trains_the_same_on_cpu():
    """Both notebooks' code, run top to bottom as a kernel would: the same parameters, bit for bit."""
    probe = (
        "import sys, torch\nfrom graphify.notebooks import read_notebook\n"
        "exec(compile(read_notebook(sys.argv[1]).source, sys.argv[1], 'exec'), globals())\n"
        "print(sum(p.double().sum().item() for p in model.parameters()), correct.item())\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    outputs = [
        subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, env=env, timeout=300)
        for path in (NOTEBOOK, REWRITTEN)
    ]
    assert all(o.returncode == 0 for o in outputs), [o.stderr[-2000:] for o in outputs]
    assert outputs[0].stdout.splitlines()[-1] == outputs[1].stdout.splitlines()[-1]


def test_outputs_do_not_count_against_the_size_limit(tmp_path):
    """A notebook with large outputs (embedded plots) is checked: the limit is on its code."""
    from graphify.files import MAX_BYTES

    data = json.loads(NOTEBOOK.read_text())
    data["cells"][2]["outputs"] = [{"data": {"image/png": "A" * (MAX_BYTES + 1024)}, "metadata": {}, "output_type": "display_data"}]
    big = tmp_path / "big.ipynb"
    big.write_text(json.dumps(data, indent=1))
    result = run("check", "--format", "json", str(big))
    assert result.exit_code == 1 and json.loads(result.stdout)["errors"] == []


@pytest.mark.parametrize("source", [[1, 2], 123, None])
def test_a_code_cell_whose_source_is_not_text_is_one_line_for_its_file_and_the_run_goes_on(tmp_path, source):
    bad = tmp_path / "bad.ipynb"
    bad.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "source": source}], "nbformat": 4}))
    good = tmp_path / "good.py"
    good.write_text("x = 1\n")
    for command in ("check", "rewrite"):
        result = CliRunner().invoke(cli.cli, [command, str(bad), str(good)])
        assert result.exit_code == 2 and "internal error" not in result.output, result.output
        assert f"{bad}: not a valid notebook: code cell 1's `source` is not text or a list of lines" in result.stderr


@pytest.mark.parametrize(
    "future",
    [["from __future__ import annotations\n"], ["from __future__ import (\n", "    annotations,\n", ")\n"]],
    ids=["one-line", "parenthesized"],
)
def test_a_future_import_in_a_later_cell_is_rewritten_and_kept(tmp_path, future):
    """Jupyter compiles each cell on its own: a `from __future__` import at the top of cell 3 is valid there,
    though it would not be in the middle of one module."""
    data = json.loads(NOTEBOOK.read_text())
    cell = [c for c in data["cells"] if c["cell_type"] == "code"][2]
    cell["source"] = future + cell["source"]
    path = tmp_path / "train.ipynb"
    path.write_text(json.dumps(data, indent=1) + "\n")
    assert run("check", "--exit-zero", str(path)).exit_code == 0
    result = run("rewrite", "--in-place", str(path))
    assert result.exit_code == 1, result.stderr
    assert "rewritten, will capture as `train_step`" in result.stderr
    written = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert written[2]["source"][: len(future)] == future
    assert "train_step = CapturedStep(" in "".join(written[4]["source"])


def test_the_runtime_import_follows_a_future_import_opening_the_first_cell(tmp_path):
    """A `from __future__` import opening the first code cell opens the joined module too: the import of the
    runtime goes after it, where Jupyter still compiles the cell."""
    data = json.loads(NOTEBOOK.read_text())
    cell = next(c for c in data["cells"] if c["cell_type"] == "code")
    cell["source"] = ["from __future__ import annotations\n", *cell["source"]]
    path = tmp_path / "train.ipynb"
    path.write_text(json.dumps(data, indent=1) + "\n")
    assert run("rewrite", "--in-place", str(path)).exit_code == 1
    first = "".join(next(c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")["source"])
    assert first.startswith("from __future__ import annotations\nfrom graphify.runtime import CapturedStep\n"), first
