"""The command line, with a fake analyzer (tests/cli_fakes.py) standing in for graphify.analysis.

Bad input (syntax errors, encodings, binary and unreadable files, missing paths, empty folders,
symlink loops) must give one clear line on stderr each, exit 2, no traceback, and every other file
still checked. The same cases run once more through the real engine in test_real_engine_bad_input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_fakes import BAD_SCRIPT, CLEAN_SCRIPT, fake_analyze_source
from click.testing import CliRunner

import graphify.cli as cli
import graphify.commands.check as check_command

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_engine(monkeypatch):
    monkeypatch.setattr(check_command, "get_analyzer", lambda: fake_analyze_source)


@pytest.fixture
def project(tmp_path, monkeypatch, fake_engine):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NO_COLOR", raising=False)
    return tmp_path


def run(*args):
    return CliRunner().invoke(cli.cli, list(args))


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# --- exit codes and formats ----------------------------------------------------------------------


def test_clean_file_exits_0(project):
    write(project / "clean.py", CLEAN_SCRIPT)
    result = run("check", "clean.py")
    assert result.exit_code == 0, result.output
    assert (
        result.stdout
        == "clean.py:3: train loop in main(): capturable\n\n1 loop, 1 capturable, 0 capturable after rewrite, 0 not capturable, 0 breakers\n"
    )
    assert result.stderr == ""


def test_findings_exit_1_and_text_output(project):
    write(project / "bad.py", BAD_SCRIPT)
    result = run("check", "bad.py")
    assert result.exit_code == 1
    assert result.stdout == (
        "bad.py:3: train loop in main(): capturable-after-rewrite\n"
        "bad.py:6:14: GFY001 loss.item() breaks capture\n"
        "\n"
        "1 loop, 0 capturable, 1 capturable after rewrite, 0 not capturable, 1 breaker\n"
    )
    for fmt in ("concise", "text"):
        assert run("check", "--output-format", fmt, "bad.py").stdout == result.stdout
    full = run("check", "--output-format", "full", "bad.py")
    assert full.exit_code == 1
    assert full.stdout == (
        "bad.py:3: train loop in main(): capturable-after-rewrite\n"
        "bad.py:6:14: GFY001 loss.item() breaks capture\n"
        "    6 |     total += loss.item()\n"
        "      |              ^^^^^^^^^^^\n"
        "  fix: do something else\n"
        "\n"
        "1 loop, 0 capturable, 1 capturable after rewrite, 0 not capturable, 1 breaker\n"
    )


def test_exit_zero(project):
    write(project / "bad.py", BAD_SCRIPT)
    assert run("check", "--exit-zero", "bad.py").exit_code == 0


@pytest.mark.parametrize("fmt", ["json", "sarif", "github"])
def test_formats(project, fmt):
    write(project / "bad.py", BAD_SCRIPT)
    result = run("check", "--format", fmt, "bad.py")
    assert result.exit_code == 1
    if fmt == "json":
        doc = json.loads(result.stdout)
        assert [d["code"] for d in doc["diagnostics"]] == ["GFY001"]
        assert doc["loops"][0]["verdict"] == "capturable-after-rewrite"
    elif fmt == "sarif":
        assert json.loads(result.stdout)["runs"][0]["results"][0]["ruleId"] == "GFY001"
    else:
        assert result.stdout.startswith("::error title=graphify (GFY001),file=bad.py,line=6,col=14,endLine=6,endColumn=25::")


def test_output_format_alias(project):
    write(project / "bad.py", BAD_SCRIPT)
    assert json.loads(run("check", "--output-format", "json", "bad.py").stdout)["version"] == 3


def test_statistics(project):
    write(project / "a.py", BAD_SCRIPT + "    idx = torch.nonzero(m)\n    y = x.item()\n")
    result = run("check", "--statistics", "a.py")
    assert result.exit_code == 1
    assert result.stdout == "2  GFY001  tensor-item\n1  GFY008  data-dependent-output-size\n"
    stats = json.loads(run("check", "--statistics", "--format", "json", "a.py").stdout)
    assert stats == [
        {"code": "GFY001", "name": "tensor-item", "count": 2},
        {"code": "GFY008", "name": "data-dependent-output-size", "count": 1},
    ]


def test_select_and_ignore_flags(project):
    write(project / "a.py", BAD_SCRIPT + "    idx = torch.nonzero(m)\n")
    codes = lambda *flags: [d["code"] for d in json.loads(run("check", "--format", "json", *flags, "a.py").stdout)["diagnostics"]]  # noqa: E731
    assert codes() == ["GFY001", "GFY008"]
    assert codes("--select", "GFY008") == ["GFY008"]
    assert codes("--ignore", "GFY001") == ["GFY008"]
    assert codes("--select", "host-sync", "--ignore", "GFY00") == []


def test_config_then_cli_override(project):
    write(project / "pyproject.toml", '[tool.graphify]\nignore = ["GFY001"]\n[tool.graphify.per-file-ignores]\n"legacy/*" = ["ALL"]\n')
    write(project / "a.py", BAD_SCRIPT)
    write(project / "legacy" / "b.py", BAD_SCRIPT)
    assert run("check", "a.py", "legacy/b.py").exit_code == 0
    result = run("check", "--select", "GFY001", "a.py", "legacy/b.py")
    assert result.exit_code == 1
    assert "a.py:6:14: GFY001" in result.stdout
    assert "legacy/b.py:6" not in result.stdout  # per-file-ignores still apply


def test_suppression_comment(project):
    write(project / "a.py", BAD_SCRIPT.replace("loss.item()", "loss.item()  # graphify: ignore[GFY001]"))
    assert run("check", "a.py").exit_code == 0


@pytest.mark.parametrize(
    "args, config, message",
    [
        (["--select", "GFY999"], None, "graphify: error: --select: unknown rule selector 'GFY999'"),
        ([], "[tool.graphify]\nselct = []\n", "unknown key 'selct' (did you mean 'select'?)"),
        ([], "[tool.graphify\n", "invalid TOML"),
    ],
)
def test_config_errors_exit_2(project, args, config, message):
    write(project / "a.py", BAD_SCRIPT)
    if config:
        write(project / "pyproject.toml", config)
    result = run("check", *args, "a.py")
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert result.stdout == ""


def test_usage_error_exit_2(project):
    result = run("check", "--format", "xml", ".")
    assert result.exit_code == 2
    assert "Invalid value for '--output-format'" in result.stderr


def test_default_path_is_current_folder(project):
    write(project / "pkg" / "a.py", BAD_SCRIPT)
    result = run("check", "--format", "json")
    assert [d["path"] for d in json.loads(result.stdout)["diagnostics"]] == ["./pkg/a.py"]


# --- bad input -----------------------------------------------------------------------------------


def make_bad_inputs(root: Path) -> dict[str, str]:
    """Files and paths that cannot be analysed -> the message expected on stderr for each."""
    write(root / "syntax.py", "import torch\nfor x in loader:\n    loss.backward(\n")
    write(root / "latin1.py", "import torch\nname = 'Müller'\n".encode("latin-1"))
    write(root / "blob.py", b"\x00\x01\x02torch\x00")
    (root / "empty").mkdir()
    write(root / "loop" / "ok.py", "x = 1\n")
    os.symlink("..", root / "loop" / "again")
    return {
        "syntax.py": "graphify: syntax.py: syntax error at line 3",
        "latin1.py": "graphify: latin1.py: not valid UTF-8 (byte 0xfc at line 2, column 10)",
        "blob.py": "graphify: blob.py: binary file (contains NUL bytes), not Python source",
        "missing.py": "graphify: missing.py: No such file or directory",
        "empty": "graphify: empty: no Python files found",
        "loop": "graphify: loop/again: symlink loop: links back to a folder that contains it (..); not followed",
    }


def test_bad_input(project):
    expected = make_bad_inputs(project)
    write(project / "good.py", BAD_SCRIPT)
    result = run("check", *expected, "good.py")
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == len(expected)
    for message in expected.values():
        assert sum(line.startswith(message) for line in lines) == 1, (message, lines)
    # The good file is still checked and reported.
    assert "good.py:6:14: GFY001" in result.stdout
    assert result.stdout.endswith("1 loop, 0 capturable, 1 capturable after rewrite, 0 not capturable, 1 breaker, 6 errors\n")


def test_bad_input_json_lists_errors(project):
    expected = make_bad_inputs(project)
    result = run("check", "--format", "json", *expected)
    assert result.exit_code == 2
    errors = json.loads(result.stdout)["errors"]
    assert sorted(e["path"] for e in errors) == sorted(["syntax.py", "latin1.py", "blob.py", "missing.py", "empty", "loop/again"])


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can read a chmod 000 file")
def test_unreadable_file(project):
    p = write(project / "locked.py", BAD_SCRIPT)
    write(project / "good.py", BAD_SCRIPT)
    p.chmod(0)
    try:
        result = run("check", "locked.py", "good.py")
    finally:
        p.chmod(0o644)
    assert result.exit_code == 2
    assert result.stderr == "graphify: locked.py: permission denied\n"
    assert "good.py:6:14" in result.stdout


def test_internal_error_in_one_file(project):
    write(project / "crash.py", "RAISE_INTERNAL = 1\n")
    write(project / "good.py", BAD_SCRIPT)
    result = run("check", "crash.py", "good.py")
    assert result.exit_code == 2
    assert result.stderr == "graphify: crash.py: internal error: RuntimeError: boom\n"
    assert "good.py:6:14" in result.stdout


def test_exit_zero_does_not_hide_file_errors(project):
    write(project / "good.py", BAD_SCRIPT)
    assert run("check", "--exit-zero", "good.py", "missing.py").exit_code == 2


def test_error_line_does_not_repeat_the_path():
    assert check_command.error_line("a.py", "a.py:3: syntax error: x") == "graphify: a.py:3: syntax error: x"
    assert check_command.error_line("a.py", "two\nlines") == "graphify: a.py: two lines"


# --- the process pool ----------------------------------------------------------------------------


def test_many_files_use_the_pool_and_match_serial(project, monkeypatch):
    for i in range(check_command.PARALLEL_THRESHOLD * 3):
        write(project / "pkg" / f"m{i:02}.py", BAD_SCRIPT if i % 2 else CLEAN_SCRIPT)
    write(project / "pkg" / "zz_crash.py", "RAISE_INTERNAL = 1\n")
    used = []
    real = check_command._analyze_in_pool
    monkeypatch.setattr(check_command, "_analyze_in_pool", lambda *a: used.append(1) or real(*a))
    parallel = run("check", "--format", "json", "-j", "3", "pkg")
    assert used == [1]
    serial = run("check", "--format", "json", "-j", "1", "pkg")
    assert used == [1]
    assert parallel.exit_code == serial.exit_code == 2
    assert parallel.stdout == serial.stdout
    assert len(json.loads(parallel.stdout)["diagnostics"]) == check_command.PARALLEL_THRESHOLD * 3 // 2


def test_few_files_stay_in_process(project, monkeypatch):
    for i in range(check_command.PARALLEL_THRESHOLD):
        write(project / f"m{i}.py", BAD_SCRIPT)
    monkeypatch.setattr(check_command, "_analyze_in_pool", lambda *a: pytest.fail("pool used"))
    assert run("check", ".").exit_code == 1


# --- rules / rule --------------------------------------------------------------------------------


def test_rules_table_and_json():
    from graphify.rules import all_rules

    result = run("rules")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["code", "name", "category", "severity", "rewritable", "summary"]
    assert len(lines) == len(all_rules()) + 1
    assert lines[1].startswith("GFY001  tensor-item")
    doc = json.loads(run("rules", "--format", "json").stdout)
    assert doc[0]["code"] == "GFY001"
    assert set(doc[0]) == {"code", "name", "category", "severity", "rewritable", "summary", "url"}


def test_rule_doc():
    from graphify.rules import rule_doc

    result = run("rule", "gfy001")
    assert result.exit_code == 0
    assert result.stdout == rule_doc("GFY001").rstrip("\n") + "\n"


def test_unknown_rule():
    result = run("rule", "GFY999")
    assert result.exit_code == 2
    assert result.stderr.startswith("graphify: error: unknown rule code 'GFY999'")


# --- the real engine and the real process --------------------------------------------------------


def _engine_available() -> bool:
    try:
        check_command.get_analyzer()
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _engine_available(), reason="graphify.engine not there yet")
def test_real_engine_bad_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    expected = make_bad_inputs(tmp_path)
    write(
        tmp_path / "good.py",
        "import torch\n\ndef main(model, loader, opt):\n    for x in loader:\n"
        "        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n        print(loss.item())\n",
    )
    result = run("check", "--format", "json", *expected, "good.py")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(result.stderr.splitlines()) == len(expected)
    doc = json.loads(result.stdout)
    assert {e["path"] for e in doc["errors"]} == {"syntax.py", "latin1.py", "blob.py", "missing.py", "empty", "loop/again"}
    assert any(d["path"] == "good.py" and d["code"] == "GFY001" for d in doc["diagnostics"])


def graphify_process(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "graphify", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_python_dash_m(tmp_path):
    result = graphify_process("check", str(tmp_path / "missing.py"))
    assert result.returncode == 2
    assert result.stderr == f"graphify: {tmp_path / 'missing.py'}: No such file or directory\n"
    assert graphify_process("--version").stdout.strip() == "graphify, version 0.1.0"


def test_cli_import_stays_light():
    code = (
        "import sys, graphify.cli\n"
        "heavy = [m for m in ('libcst', 'pathspec', 'graphify.rules', 'graphify.analysis', 'tomllib') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_color_unless_tty(tmp_path):
    write(tmp_path / "a.py", BAD_SCRIPT)
    # Through a pipe: never coloured (whatever the engine reports).
    result = graphify_process("check", "a.py", cwd=tmp_path)
    assert "\x1b[" not in result.stdout


def test_no_color_env(monkeypatch):
    tty = type("T", (), {"isatty": lambda self: True})()
    monkeypatch.setenv("NO_COLOR", "1")
    assert check_command._want_color(tty) is False
    monkeypatch.setenv("NO_COLOR", "")
    assert check_command._want_color(tty) is True


# --- the conventions of ruff ---------------------------------------------------------------------


def test_stdin_is_checked_under_its_given_name(project):
    result = CliRunner().invoke(cli.cli, ["check", "-", "--stdin-filename", "train.py"], input=BAD_SCRIPT)
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("train.py:")


def test_stdin_is_decoded_as_a_file_is(project):
    """Its bytes, not the terminal's text: a coding cookie is honoured, and undecodable or binary input is
    one line and exit 2, as for a file."""
    latin = ("# -*- coding: latin-1 -*-\n# r\u00e9sum\u00e9\n" + BAD_SCRIPT).encode("latin-1")
    assert CliRunner().invoke(cli.cli, ["check", "-"], input=latin).exit_code == 1
    undeclared = CliRunner().invoke(cli.cli, ["check", "-"], input=b"x = 1\ny = 2\n# r\xe9sum\xe9\n" + BAD_SCRIPT.encode())
    assert undeclared.exit_code == 2 and "-: not valid UTF-8 (byte 0xe9 at line 3" in undeclared.stderr
    binary = CliRunner().invoke(cli.cli, ["check", "-"], input=b"x = 1\0\n")
    assert binary.exit_code == 2 and "-: binary file (contains NUL bytes)" in binary.stderr


def test_quiet_prints_nothing_and_keeps_the_exit_code(project):
    write(project / "bad.py", BAD_SCRIPT)
    result = run("check", "--quiet", "bad.py")
    assert result.exit_code == 1 and result.stdout == ""


def test_output_file_gets_the_report(project):
    write(project / "bad.py", BAD_SCRIPT)
    result = run("check", "-o", "report.json", "--format", "json", "bad.py")
    assert result.exit_code == 1 and result.stdout == ""
    assert json.loads((project / "report.json").read_text())["diagnostics"]


def test_color_can_be_forced_either_way(project):
    write(project / "bad.py", BAD_SCRIPT)
    assert "\x1b[" in run("check", "--color", "bad.py").stdout
    assert "\x1b[" not in run("check", "--no-color", "bad.py").stdout


def test_extend_select_and_config_path(project):
    write(project / "bad.py", BAD_SCRIPT)
    write(project / "conf" / "pyproject.toml", '[tool.graphify]\nselect = ["GFY5"]\n')
    narrowed = run("check", "--config", "conf/pyproject.toml", "bad.py")
    widened = run("check", "--config", "conf/pyproject.toml", "--extend-select", "GFY0", "bad.py")
    assert "GFY001" not in narrowed.stdout and "GFY001" in widened.stdout
    missing = run("check", "--config", "nope.toml", "bad.py")
    assert missing.exit_code == 2 and "nope.toml" in missing.stderr


def test_statistics_refuses_formats_it_cannot_print(project):
    write(project / "bad.py", BAD_SCRIPT)
    result = run("check", "--statistics", "--format", "sarif", "bad.py")
    assert result.exit_code == 2 and "--statistics prints text or json" in result.stderr


def test_python_reports_the_syntax_error(tmp_path):
    """The real engine reports Python's own message and line, not the parser's token list."""
    path = write(tmp_path / "broken.py", "import torch\nfor x in y:\n    x.backward(\n\nz = 2\n")
    result = CliRunner().invoke(cli.cli, ["check", str(path)])
    assert result.exit_code == 2
    assert "syntax error at line 3, column 15: '(' was never closed" in result.stderr
