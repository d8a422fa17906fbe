"""The README tells a new user what to run and what they will see: its commands are the ones CI runs, its
sample output is what `graphify check` prints today, and its numbers hold."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

import graphify.cli as cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def blocks(text: str) -> list[str]:
    """The fenced code blocks of a markdown text, indented ones included, without their fences."""
    found = re.findall(r"^( *)```[a-z]*\n(.*?)^\1```", text, flags=re.S | re.M)
    return [textwrap_dedent(body, len(indent)) for indent, body in found]


def textwrap_dedent(body: str, width: int) -> str:
    return "".join(line[width:] if line[:width].isspace() else line for line in body.splitlines(keepends=True))


def check_output(*args: str) -> str:
    return CliRunner().invoke(cli.cli, ["check", *args]).stdout


def test_the_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    (ci_tests,) = [line for line in ci.splitlines() if "pytest" in line]
    (readme_tests,) = [b for b in blocks(README) if "pytest" in b and "pip install" in b]
    assert readme_tests.strip().endswith("&& " + ci_tests.strip())


def test_the_first_command_checks_a_bundled_example_and_the_output_shown_is_real(monkeypatch):
    monkeypatch.chdir(ROOT)
    first = next(b for b in blocks(README) if b.startswith("pip install -e . && graphify check"))
    example = re.search(r"graphify check --exit-zero (\S+)", first).group(1)
    assert (ROOT / example).is_file()
    shown = next(b for b in blocks(README) if b.startswith(f"{example}:"))
    assert check_output(example) == shown, "README.md: paste what `graphify check` prints for the example now"


def test_the_helper_example_is_real_output(monkeypatch):
    monkeypatch.chdir(ROOT)
    (line,) = [b.strip() for b in blocks(README) if b.startswith("fixtures/check/nanogpt_char.py:173:")]
    assert line in check_output("fixtures/check/nanogpt_char.py").splitlines()


def test_no_release_or_repository_that_does_not_exist():
    """No release is tagged and no public repository is named: the README must not send a user to one."""
    assert not re.search(r"rev: v\d", README)
    assert "github.com/" not in README
    assert "repo: local" in README


def test_the_inline_runtime_size_in_the_docs_holds():
    """`--runtime inline` pastes the runtime's code, as `--runtime vendor` writes it."""
    from graphify.rewrite.bundle import vendor_code

    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    claimed = int(re.search(r"pastes the whole runtime \(about ([\d,]+) lines", usage).group(1).replace(",", ""))
    lines = len(vendor_code().splitlines())
    assert abs(lines - claimed) <= 0.25 * claimed, f"the runtime has {lines} lines; docs/usage.md says about {claimed}"
