"""More bad input for the command line: unreadable files and configs, an empty --select, unknown codes in
suppression comments, CRLF notebooks, verify's errors, and SARIF columns.

Unreadable files are simulated (open and os.access refuse them, as for a chmod 000 file and a user
other than root), since the tests may run as root, who can read anything.
"""

from __future__ import annotations

import builtins
import json
import os
from pathlib import Path

import pytest
from cli_fakes import BAD_SCRIPT, CLEAN_SCRIPT, fake_analyze_source
from click.testing import CliRunner

import graphify.cli as cli
import graphify.commands.check as check_command

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTEBOOK = FIXTURES / "notebooks" / "train_classifier.ipynb"
REWRITTEN = FIXTURES / "notebooks" / "train_classifier.rewritten.ipynb"


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(check_command, "get_analyzer", lambda: fake_analyze_source)
    return tmp_path


@pytest.fixture
def lock(monkeypatch):
    """lock(path): reading it fails with "Permission denied" from now on."""
    locked: set[str] = set()
    real_open, real_access = builtins.open, os.access

    def is_locked(path) -> bool:
        return isinstance(path, (str, os.PathLike)) and os.path.abspath(path) in locked

    def fake_open(file, *args, **kwargs):
        if is_locked(file):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    def fake_access(path, mode, *args, **kwargs):
        if is_locked(path) and mode & os.R_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "access", fake_access)
    return lambda path: locked.add(os.path.abspath(path))


def run(*args):
    return CliRunner().invoke(cli.cli, list(args))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- 1. an unreadable file named on the command line ---------------------------------------------


def test_check_reports_an_unreadable_file_in_one_line_and_checks_the_others(project, lock):
    lock(write(project / "locked.py", BAD_SCRIPT))
    write(project / "good.py", BAD_SCRIPT)
    result = run("check", "locked.py", "good.py")
    assert result.exit_code == 2
    assert result.stderr == "graphify: locked.py: permission denied\n"
    assert "good.py:6:14: GFY001" in result.stdout


def test_rewrite_reports_an_unreadable_file_in_one_line_and_rewrites_the_others(project, lock):
    lock(write(project / "locked.py", BAD_SCRIPT))
    write(project / "good.py", "import torch\n\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n")
    result = run("rewrite", "locked.py", "good.py")
    assert result.exit_code == 2
    assert "graphify: locked.py: permission denied" in result.stderr.splitlines()
    assert "Usage:" not in result.stderr
    assert "+++ b/good.py" in result.stdout


# --- 2. an unreadable pyproject.toml -------------------------------------------------------------


def test_an_unreadable_pyproject_is_a_config_error(project, lock):
    write(project / "a.py", BAD_SCRIPT)
    lock(write(project / "pyproject.toml", '[tool.graphify]\nselect = ["GFY5"]\n'))
    expected = f"graphify: error: {project / 'pyproject.toml'}: cannot read it: permission denied\n"
    for args in (["a.py"], ["--config", str(project / "pyproject.toml"), "a.py"]):
        result = run("check", *args)
        assert (result.exit_code, result.stderr, result.stdout) == (2, expected, ""), args
    result = run("rewrite", "a.py")
    assert (result.exit_code, result.stderr) == (2, expected)


# --- 3. a notebook with Windows line endings -----------------------------------------------------


def test_a_crlf_notebook_rewritten_in_place_keeps_its_crlf_line_endings(tmp_path):
    target = tmp_path / "train.ipynb"
    target.write_bytes(NOTEBOOK.read_bytes().replace(b"\n", b"\r\n"))
    assert run("rewrite", "--in-place", str(target)).exit_code == 1
    assert target.read_bytes() == REWRITTEN.read_bytes().replace(b"\n", b"\r\n")
    assert run("rewrite", "--check", str(target)).exit_code == 0


# --- 4. verify's errors --------------------------------------------------------------------------


def test_verify_prints_its_error_on_stderr_in_one_unwrapped_line(tmp_path):
    missing = tmp_path / ("a_script_with_a_name_long_enough_that_its_error_line_is_wider_than_a_terminal" + ".py")
    result = run("verify", str(missing))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"ERROR: cannot read {missing}: No such file or directory\n"
    as_json = run("verify", str(missing), "--json")
    assert as_json.exit_code == 2 and json.loads(as_json.stdout)["status"] == "error"


# --- 5. unknown codes in suppression comments ----------------------------------------------------

UNKNOWN_CODES = (
    "import torch\n"
    "x = 1  # graphify: ignore[GFY999, GFY001] -- the second is a real code\n"
    "y = 2  # noqa: GFY77, E501\n"
    "z = 3  # graphify: ignore[GFY0, all]\n"
    "# graphify: ignore[host-sync]\n" + CLEAN_SCRIPT
)


def test_check_warns_of_unknown_codes_in_suppression_comments_without_failing(project):
    write(project / "a.py", UNKNOWN_CODES)
    result = run("check", "a.py")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "graphify: warning: a.py:2: unknown rule code 'GFY999' in a suppression comment; it suppresses nothing",
        "graphify: warning: a.py:3: unknown rule code 'GFY77' in a suppression comment; it suppresses nothing",
        "graphify: warning: a.py:5: unknown rule code 'host-sync' in a suppression comment; it suppresses nothing",
    ]
    assert run("check", "--quiet", "a.py").stderr == ""


def test_unknown_codes_are_warned_of_from_the_worker_processes_too(project):
    for n in range(check_command.PARALLEL_THRESHOLD + 2):
        write(project / f"m{n}.py", "x = 1  # graphify: ignore[GFY999]\n")
    result = run("check", "--jobs", "2", ".")
    assert result.exit_code == 0, result.output
    assert len(result.stderr.splitlines()) == check_command.PARALLEL_THRESHOLD + 2
    assert all(
        line.endswith("unknown rule code 'GFY999' in a suppression comment; it suppresses nothing") for line in result.stderr.splitlines()
    )


# --- 6. SARIF columns ----------------------------------------------------------------------------


def test_sarif_columns_count_code_points_and_say_so(tmp_path):
    line = '        s = "\U0001f600"; print(loss.item())'  # an astral character: 1 code point, 2 UTF-16 units, 4 bytes
    path = write(
        tmp_path / "train.py",
        "import torch\n\ndef main(model, loader, opt):\n    for x in loader:\n"
        "        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n" + line + "\n",
    )
    run_ = json.loads(run("check", "--format", "sarif", str(path)).stdout)["runs"][0]
    assert run_["columnKind"] == "unicodeCodePoints"
    region = next(r for r in run_["results"] if r["ruleId"] == "GFY001")["locations"][0]["physicalLocation"]["region"]
    start = line.index("loss.item()") + 1
    assert (region["startLine"], region["startColumn"], region["endColumn"]) == (8, start, start + len("loss.item()"))


# --- 7. an empty --select ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", " , "])
def test_an_empty_select_is_a_usage_error(project, value):
    write(project / "a.py", BAD_SCRIPT)
    for command in ("check", "rewrite"):
        result = run(command, "--select", value, "a.py")
        assert (result.exit_code, result.stderr, result.stdout) == (2, "graphify: error: --select: no rule codes given\n", ""), command
