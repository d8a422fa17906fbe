from __future__ import annotations

import os
import pickle

import pytest

from graphify.config import (
    ConfigError,
    Settings,
    glob_matches,
    load_settings,
    settings_from_table,
    split_selectors,
)
from graphify.rules import rules_by_code

RULES = rules_by_code()
ITEM = RULES["GFY001"]  # host-sync
NONZERO = RULES["GFY008"]  # host-sync, not rewritable
OTHER = next(r for r in RULES.values() if not r.code.startswith("GFY0"))


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- enabled ---------------------------------------------------------------------------------------


def test_default_selects_everything():
    s = Settings()
    assert all(s.enabled(r, "x.py") for r in RULES.values())


@pytest.mark.parametrize(
    "select, ignore, item, other",
    [
        (["ALL"], [], True, True),
        (["all"], [], True, True),
        (["GFY001"], [], True, False),
        (["gfy001"], [], True, False),
        (["GFY0"], [], True, False),
        (["host-sync"], [], True, False),
        (["ALL"], ["GFY0"], False, True),
        (["ALL"], ["host-sync"], False, True),
        (["GFY0"], ["GFY001"], False, False),
        ([], [], False, False),
    ],
)
def test_enabled_selectors(select, ignore, item, other):
    s = Settings(select=select, ignore=ignore)
    assert s.enabled(ITEM, "x.py") is item
    assert s.enabled(OTHER, "x.py") is other


def test_per_file_ignores(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings(per_file_ignores={"tests/**": ["GFY0"], "scratch_*.py": ["ALL"]}, root=str(tmp_path))
    assert not s.enabled(ITEM, "tests/unit/test_a.py")
    assert s.enabled(OTHER, "tests/unit/test_a.py")
    assert s.enabled(ITEM, "src/tests.py")
    assert not s.enabled(OTHER, "deep/er/scratch_1.py")  # no slash: matches the name at any depth
    assert not s.enabled(ITEM, str(tmp_path / "tests" / "a.py"))  # absolute paths are made relative to root
    assert s.enabled(ITEM, "train.py")


def test_per_file_ignores_relative_to_config_root(tmp_path, monkeypatch):
    (tmp_path / "proj" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "proj" / "sub")
    s = Settings(per_file_ignores={"sub/legacy.py": ["ALL"]}, root=str(tmp_path / "proj"))
    assert not s.enabled(ITEM, "legacy.py")  # cwd is proj/sub; the glob is anchored at proj
    assert s.enabled(ITEM, "other.py")


@pytest.mark.parametrize(
    "pattern, path, is_dir, expected",
    [
        ("build", "build/x.py", False, True),
        ("build", "src/build/x.py", False, True),
        ("build/", "build", False, False),  # folder-only glob, and `build` is a file
        ("build/", "build", True, True),
        ("build/", "build/x.py", False, True),
        ("src/gen", "src/gen/a.py", False, True),
        ("src/gen", "other/src/gen/a.py", False, False),  # anchored at the root
        ("**/gen", "other/src/gen/a.py", False, True),
        ("*.py", "a/b/c.py", False, True),
        ("src/*.py", "src/a/b.py", False, False),  # * does not cross /
        ("src/**/*.py", "src/a/b.py", False, True),
        ("src/**/*.py", "src/b.py", False, True),
        ("test_[ab].py", "x/test_a.py", False, True),
        ("test_[!ab].py", "x/test_a.py", False, False),
        ("te?t.py", "test.py", False, True),
    ],
)
def test_glob_matches(pattern, path, is_dir, expected):
    assert glob_matches(pattern, path, is_dir) is expected


def test_excluded(tmp_path):
    s = Settings(exclude=["legacy/"], extend_exclude=["*_pb2.py"], root=str(tmp_path))
    assert s.excluded(str(tmp_path / "legacy" / "a.py"))
    assert s.excluded(str(tmp_path / "x" / "m_pb2.py"))
    assert not s.excluded(str(tmp_path / "x" / "m.py"))
    assert not s.excluded(str(tmp_path / "legacy" / "a.py"), parents=False)


def test_settings_pickle_round_trip():
    s = Settings(select=["GFY0"], per_file_ignores={"a/*": ["ALL"]}, root="/x")
    assert pickle.loads(pickle.dumps(s)) == s


# --- CLI overrides -------------------------------------------------------------------------------


def test_split_selectors():
    assert split_selectors(None) is None
    assert split_selectors("GFY001, GFY1,,host-sync ") == ["GFY001", "GFY1", "host-sync"]


def test_cli_select_overrides_config_select_and_ignore():
    config = Settings(select=["GFY1"], ignore=["GFY001"])
    s = config.with_cli(select=["GFY001"])
    assert s.enabled(ITEM, "x.py")  # re-enabled although the config ignores it
    assert not s.enabled(OTHER, "x.py")
    assert config.select == ["GFY1"]  # the config object is not changed


def test_cli_ignore_adds_to_config_ignore():
    s = Settings(ignore=["GFY008"]).with_cli(ignore=["GFY001"])
    assert not s.enabled(ITEM, "x.py")
    assert not s.enabled(NONZERO, "x.py")
    assert s.enabled(OTHER, "x.py")


def test_cli_unknown_selector():
    with pytest.raises(ConfigError, match=r"--select: unknown rule selector 'GFY999'"):
        Settings().with_cli(select=["GFY999"])
    with pytest.raises(ConfigError, match=r"--ignore: unknown rule selector 'host-sink' \(did you mean 'host-sync'\?\)"):
        Settings().with_cli(ignore=["host-sink"])


# --- loading -------------------------------------------------------------------------------------


def test_no_config_gives_defaults(tmp_path):
    write(tmp_path / "pkg" / "a.py", "")
    assert load_settings([str(tmp_path / "pkg" / "a.py")]) == Settings()


def test_nearest_pyproject_with_table_wins(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.graphify]\nselect = ["GFY0"]\n')
    write(tmp_path / "sub" / "pyproject.toml", '[project]\nname = "sub"\n')  # no table: keep looking up
    write(tmp_path / "sub" / "inner" / "train.py", "")
    s = load_settings([str(tmp_path / "sub" / "inner" / "train.py"), "elsewhere"])
    assert s.select == ["GFY0"]
    assert s.root == str(tmp_path)
    assert s.config_file == str(tmp_path / "pyproject.toml")


def test_first_path_folder_and_missing_path(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.graphify]\nignore = ["GFY5"]\n')
    (tmp_path / "src").mkdir()
    assert load_settings([str(tmp_path / "src")]).ignore == ["GFY5"]
    assert load_settings([str(tmp_path / "src" / "missing.py")]).ignore == ["GFY5"]


def test_all_keys(tmp_path):
    write(
        tmp_path / "pyproject.toml",
        """
[tool.graphify]
select = ["ALL"]
ignore = ["GFY5", "rng"]
exclude = ["legacy/"]
extend-exclude = ["*_pb2.py"]
respect-gitignore = false

[tool.graphify.per-file-ignores]
"tests/**" = ["GFY0"]
""",
    )
    s = load_settings([str(tmp_path)])
    assert s == Settings(
        select=["ALL"],
        ignore=["GFY5", "rng"],
        exclude=["legacy/"],
        extend_exclude=["*_pb2.py"],
        per_file_ignores={"tests/**": ["GFY0"]},
        respect_gitignore=False,
        root=str(tmp_path),
        config_file=str(tmp_path / "pyproject.toml"),
    )


@pytest.mark.parametrize(
    "body, message",
    [
        ('extend_exclude = ["x"]', r"unknown key 'extend_exclude' \(did you mean 'extend-exclude'\?\)"),
        ('colour = "red"', r"unknown key 'colour'; known keys: select, ignore"),
        ('select = ["GFY999"]', r"\[tool.graphify\] select: unknown rule selector 'GFY999'"),
        ('ignore = ["hostsync"]', r"ignore: unknown rule selector 'hostsync' \(did you mean 'host-sync'\?\)"),
        ('select = "ALL"', r"select: expected a list of strings, got 'ALL'"),
        ("respect-gitignore = 1", r"respect-gitignore: expected true or false"),
        ('per-file-ignores = ["x"]', r"per-file-ignores: expected a table"),
        ('[tool.graphify.per-file-ignores]\n"a/*" = ["GFY9999"]', r"per-file-ignores 'a/\*': unknown rule selector 'GFY9999'"),
        ("select = [", r"invalid TOML"),
    ],
)
def test_bad_config(tmp_path, body, message):
    header = "" if body.startswith("[tool") else "[tool.graphify]\n"
    write(tmp_path / "pyproject.toml", header + body + "\n")
    with pytest.raises(ConfigError, match=message) as info:
        load_settings([str(tmp_path)])
    assert str(tmp_path / "pyproject.toml") in str(info.value)
    assert "\n" not in str(info.value)


def test_settings_from_table_directly():
    s = settings_from_table({"select": ["GFY0"]}, os.path.join("proj", "pyproject.toml"))
    assert s.select == ["GFY0"]
    assert s.root == os.path.abspath("proj")
