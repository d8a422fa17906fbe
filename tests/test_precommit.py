"""The pre-commit hook, run by the real pre-commit against a temporary git repository.

pre-commit installs the hook the way a user gets it: from a git repository holding this working
tree (copied, committed in a temporary folder) and its .pre-commit-hooks.yaml, into a fresh
virtualenv with `language: python`. To work offline, the virtualenv is made with
VIRTUALENV_SYSTEM_SITE_PACKAGES=1, so the dependencies already installed for the tests (libcst,
click, pathspec; from a virtualenv, through PYTHONPATH) satisfy pip without an index, and PIP_NO_INDEX / PIP_NO_BUILD_ISOLATION keep pip
from looking for anything (setuptools is virtualenv's bundled seed). graphify itself is built and
installed from the copied tree into the hook's virtualenv.

Slow (~20-40 s: a virtualenv and a pip install) but part of the default run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("git") is None, reason="needs git")]

GIT_ENV = {
    "GIT_AUTHOR_NAME": "graphify tests",
    "GIT_AUTHOR_EMAIL": "tests@example.invalid",
    "GIT_COMMITTER_NAME": "graphify tests",
    "GIT_COMMITTER_EMAIL": "tests@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}

BAD = """import torch


def main(model, loader, opt):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(loss.item())
"""
CLEAN = BAD.replace("        print(loss.item())\n", "")


def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env={**os.environ, **GIT_ENV})


def hook_repo(tmp: Path) -> tuple[Path, str]:
    """A git repository holding the current working tree (committed or not), and the full hash of its
    commit: no release is tagged, so the README pins a clone's commit, as these tests do."""
    dest = tmp / "graphify-hook"
    keep = ["graphify", "pyproject.toml", "README.md", ".pre-commit-hooks.yaml"]
    for name in keep:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    git("init", "-q", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", "hook", cwd=dest)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=dest, check=True, capture_output=True, text=True).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    return dest, commit


@pytest.fixture(scope="module")
def precommit_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("precommit")
    hook, rev = hook_repo(tmp)
    env = {
        **os.environ,
        **GIT_ENV,
        "PRE_COMMIT_HOME": str(tmp / "cache"),
        "VIRTUALENV_SYSTEM_SITE_PACKAGES": "1",
        # virtualenv seeds no setuptools for Python 3.12+ unless asked; the build (no isolation) needs it.
        "VIRTUALENV_SETUPTOOLS": "bundle",
        "PIP_NO_INDEX": "1",
        # pip stores this variable's value into `build_isolation` itself: "0" turns isolation off.
        "PIP_NO_BUILD_ISOLATION": "0",
        "NO_COLOR": "1",
    }
    env.pop("PYTHONPATH", None)
    if sys.prefix != sys.base_prefix:
        # the tests run in a virtualenv: the hook's virtualenv sees the base interpreter's packages,
        # not these, so hand it the test environment's site-packages (libcst, click, pathspec)
        env["PYTHONPATH"] = os.pathsep.join(sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}))
    return tmp, hook, rev, env


def target_repo(tmp: Path, name: str, hook: Path, rev: str, script: str, pyproject: str | None = None) -> Path:
    repo = tmp / name
    repo.mkdir()
    if pyproject is not None:
        (repo / "pyproject.toml").write_text(pyproject)
    (repo / ".pre-commit-config.yaml").write_text(f"repos:\n- repo: {hook}\n  rev: {rev}\n  hooks:\n  - id: graphify-check\n")
    (repo / "train.py").write_text(script)
    (repo / "notes.txt").write_text("not python\n")
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    return repo


def pre_commit(repo: Path, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--all-files", "--color", "never"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_hook_fails_on_a_breaker_and_passes_clean_code(precommit_env):
    tmp, hook, rev, env = precommit_env
    bad = pre_commit(target_repo(tmp, "bad", hook, rev, BAD), env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "graphify check" in bad.stdout and "Failed" in bad.stdout
    assert "train.py:10:15: GFY001" in bad.stdout
    assert "Traceback" not in bad.stdout + bad.stderr

    clean = pre_commit(target_repo(tmp, "clean", hook, rev, CLEAN), env)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "Passed" in clean.stdout

    # [tool.graphify] exclude applies to the files pre-commit names (the hook passes --force-exclude).
    excluded = pre_commit(target_repo(tmp, "excluded", hook, rev, BAD, '[tool.graphify]\nexclude = ["train.py"]\n'), env)
    assert excluded.returncode == 0, excluded.stdout + excluded.stderr


def test_manifest():
    import yaml  # pre-commit depends on PyYAML

    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    (check,) = [h for h in hooks if h["id"] == "graphify-check"]
    assert check["entry"].split()[:2] == ["graphify", "check"]
    assert check["language"] == "python"
    assert check["types_or"] == ["python", "jupyter"]


REWRITABLE = BAD.replace("        print(loss.item())\n", "")


def test_rewrite_check_hook_fails_until_the_file_is_rewritten(precommit_env):
    """The livable hook: it fails only while a loop could be captured, and passes once it is."""
    tmp, hook, rev, env = precommit_env
    repo = tmp / "rewritable"
    repo.mkdir()
    (repo / ".pre-commit-config.yaml").write_text(f"repos:\n- repo: {hook}\n  rev: {rev}\n  hooks:\n  - id: graphify-rewrite-check\n")
    (repo / "train.py").write_text(REWRITABLE)
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    before = pre_commit(repo, env)
    assert before.returncode == 1 and "graphify rewrite --check" in before.stdout, before.stdout + before.stderr
    subprocess.run([sys.executable, "-m", "graphify", "rewrite", "--in-place", "train.py"], cwd=repo, env=env, check=False)
    git("add", "-A", cwd=repo)
    after = pre_commit(repo, env)
    assert after.returncode == 0, after.stdout + after.stderr


def test_the_readme_local_hook_works_as_written(precommit_env, tmp_path):
    """The `repo: local` snippet of the README, copied verbatim into a fresh repository."""
    _, _, _, env = precommit_env
    readme = (REPO / "README.md").read_text()
    snippet = readme.split("```yaml\nrepos:\n", 1)[1].split("```", 1)[0]
    if shutil.which("graphify", path=env.get("PATH")) is None:
        pytest.skip("graphify is not on PATH")
    repo = tmp_path / "local"
    repo.mkdir()
    (repo / ".pre-commit-config.yaml").write_text("repos:\n" + snippet)
    (repo / "train.py").write_text(REWRITABLE)
    (repo / "notebook.ipynb").write_text((REPO / "fixtures" / "notebooks" / "train_classifier.ipynb").read_text())
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    result = pre_commit(repo, env)
    assert result.returncode == 1 and "graphify rewrite --check" in result.stdout, result.stdout + result.stderr
    assert "notebook.ipynb:cell 5:3: train loop" in result.stdout  # notebooks are staged files of the hook too
