"""`graphify rewrite`: --in-place keeps the file's mode and owner and never writes a read-only file; what
it says of each loop; `-` rewrites standard input to standard output; a rewritten file checked again."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from click.testing import CliRunner

import graphify.cli as cli
from graphify.config import Settings
from graphify.rewrite import rewrite_source

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "check" / "mnist_main_function.py"


def test_in_place_keeps_the_mode(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(FIXTURE.read_text())
    path.chmod(0o640)
    result = CliRunner().invoke(cli.cli, ["rewrite", "--in-place", str(path)])
    assert result.exit_code == 1, result.output  # files changed
    assert "from graphify.runtime import CapturedStep" in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.stat().st_uid == os.getuid()


def test_a_read_only_file_is_left_alone_with_one_line(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(FIXTURE.read_text())
    path.chmod(0o444)
    before = path.read_text()
    result = CliRunner().invoke(cli.cli, ["rewrite", "--in-place", str(path)])
    assert result.exit_code == 2
    assert path.read_text() == before and stat.S_IMODE(path.stat().st_mode) == 0o444
    assert "could not write: the file is read-only" in result.stderr
    assert not list(tmp_path.glob(".graphify-*"))  # no temporary file left behind


def test_a_named_file_with_a_syntax_error_is_reported_even_without_a_loop(tmp_path):
    """Files named on the command line are parsed even when nothing in them could train; a folder walk
    leaves such files unparsed (they cannot hold a loop to check or rewrite)."""
    bad = tmp_path / "utils.py"
    bad.write_text("def helper(:\n    return 1\n")
    for command in ("check", "rewrite"):
        result = CliRunner().invoke(cli.cli, [command, str(bad)])
        assert result.exit_code == 2, result.output
        assert f"graphify: {bad}: syntax error at line 1, column 12: invalid syntax" in result.stderr
    assert CliRunner().invoke(cli.cli, ["check", str(tmp_path)]).exit_code == 0


def test_a_training_loop_left_unchanged_says_why_its_model_is_not_graphed_alone_either():
    trap = FIXTURE.parents[1] / "traps" / "random_in_forward.py"
    result = CliRunner().invoke(cli.cli, ["rewrite", str(trap)])
    note = next(line for line in result.stderr.splitlines() if "left unchanged" in line)
    assert "not-capturable (GFY702); the model is not graphed alone either: the model's forward itself would be captured" in note


def test_a_symbolic_link_stays_a_link_and_hard_links_all_see_the_rewrite(tmp_path):
    target = tmp_path / "real.py"
    target.write_text(FIXTURE.read_text())
    link = tmp_path / "train.py"
    link.symlink_to(target)
    assert CliRunner().invoke(cli.cli, ["rewrite", "--in-place", str(link)]).exit_code == 1
    assert link.is_symlink() and "CapturedStep" in target.read_text()
    first = tmp_path / "first.py"
    first.write_text(FIXTURE.read_text())
    second = tmp_path / "second.py"
    os.link(first, second)
    assert CliRunner().invoke(cli.cli, ["rewrite", "--in-place", str(first)]).exit_code == 1
    assert os.path.samefile(first, second) and "CapturedStep" in second.read_text()
    assert not list(tmp_path.glob(".graphify-*"))


def test_the_report_never_overwrites_a_source_file(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(FIXTURE.read_text())
    result = CliRunner().invoke(cli.cli, ["check", "-o", str(path), str(path)])
    assert result.exit_code == 2 and "that is a source file" in result.output
    assert path.read_text() == FIXTURE.read_text()


def test_code_nested_beyond_the_recursion_limit_is_one_line_for_its_file(tmp_path):
    deep = tmp_path / "deep.py"
    body = FIXTURE.read_text().replace("    for epoch in", "    z = loss" + ".relu()" * 6000 + "\n    for epoch in", 1)
    deep.write_text(body)
    for command in ("check", "rewrite"):
        result = CliRunner().invoke(cli.cli, [command, str(deep)])
        assert result.exit_code == 2 and "internal error" not in result.output, result.output
        assert f"{deep}: nested too deeply to analyse" in result.stderr


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="needs a Python that cannot compile `type X = ...`")
def test_syntax_newer_than_the_running_python_is_named_as_such(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("type Batch = tuple\n" + FIXTURE.read_text())
    result = CliRunner().invoke(cli.cli, ["rewrite", "--in-place", str(path)])
    assert result.exit_code == 2 and "internal error" not in result.output
    assert "uses syntax Python 3." in result.stderr and "cannot compile" in result.stderr
    assert path.read_text().startswith("type Batch = tuple\n") and "CapturedStep" not in path.read_text()


def test_in_place_says_the_file_is_rewritten_and_what_it_will_capture(tmp_path):
    """Nothing has run yet: the note says what the rewritten file will do when it runs."""
    path = tmp_path / "train.py"
    path.write_text(FIXTURE.read_text())
    result = CliRunner().invoke(cli.cli, ["rewrite", "--in-place", str(path)])
    assert f"{path}:47: train loop in train(): rewritten, will capture as `train_step` (warmup, capture, replay)" in result.stderr
    assert "captured as" not in result.stderr


def test_a_rewritten_file_checked_again_names_its_loops_as_captured_by_the_runtime(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(FIXTURE.read_text())
    CliRunner().invoke(cli.cli, ["rewrite", "--in-place", str(path)])
    result = CliRunner().invoke(cli.cli, ["check", "--exit-zero", str(path)])
    assert "train loop in train(): already-captured (graphify runtime)" in result.stdout
    assert "inference loop in test(): already-captured (graphify runtime)" in result.stdout
    assert "0 loops" not in result.stdout and "2 already captured" in result.stdout.splitlines()[-1]


def test_a_partial_rewrite_checked_again_names_its_loop_as_captured_by_the_runtime():
    partial = FIXTURE.parents[1] / "rewrite" / "dqn_action_with_grad.py"
    assert "= GraphedModule(" in partial.read_text()
    result = CliRunner().invoke(cli.cli, ["check", "--format", "json", str(partial)])
    loops = json.loads(result.stdout)["loops"]
    assert [(lp["kind"], lp["verdict"], lp["reasons"]) for lp in loops] == [("train", "already-captured", ["graphify runtime"])]


def test_help_names_every_command():
    commands = CliRunner().invoke(cli.cli, ["--help"]).stdout.split("Commands:\n", 1)[1]
    listed = [line.split()[0] for line in commands.splitlines() if line.startswith("  ") and line[2] != " "]
    assert listed == sorted(cli.cli.commands) and "..." not in commands  # each with its summary whole


def test_rewrite_reads_standard_input_and_writes_the_rewritten_source():
    """As `ruff format -`: the result on standard output, the notes on standard error."""
    source = FIXTURE.read_text()
    result = CliRunner().invoke(cli.cli, ["rewrite", "-", "--stdin-filename", "train.py"], input=source)
    assert result.exit_code == 1, result.stderr
    assert result.stdout == rewrite_source(source, "train.py", Settings()).code
    assert "train.py:47: train loop in train(): would capture as `train_step`" in result.stderr
    again = CliRunner().invoke(cli.cli, ["rewrite", "-"], input=result.stdout)
    assert again.exit_code == 0 and again.stdout == result.stdout  # nothing left to rewrite: the input as it came
    check = CliRunner().invoke(cli.cli, ["rewrite", "--check", "-"], input=source)
    assert check.exit_code == 1 and check.stdout == ""


def test_rewrite_reads_a_notebook_from_standard_input_by_its_given_name():
    notebook = FIXTURE.parents[1] / "notebooks" / "train_classifier.ipynb"
    result = CliRunner().invoke(cli.cli, ["rewrite", "-", "--stdin-filename", "train.ipynb"], input=notebook.read_text())
    assert result.exit_code == 1, result.stderr
    assert result.stdout == notebook.with_name("train_classifier.rewritten.ipynb").read_text()
    assert "train.ipynb:cell 5:3: train loop" in result.stderr


@pytest.mark.parametrize("args", [["-", "other.py"], ["--in-place", "-"]])
def test_standard_input_is_rewritten_alone_to_standard_output(args):
    result = CliRunner().invoke(cli.cli, ["rewrite", *args], input="x = 1\n")
    assert result.exit_code == 2 and "rewritten alone, to standard output" in result.stderr
