"""`graphify rewrite --in-place`: the file keeps its mode and owner, a read-only file is never written."""

import os
import stat
import sys
from pathlib import Path

import pytest

from click.testing import CliRunner

import graphify.cli as cli

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
