from __future__ import annotations

import builtins
import os

import pytest

from graphify.config import Settings
from graphify.files import MAX_BYTES, SourceError, discover, read_source


def touch(path, text="import torch\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def names(files, base):
    return sorted(os.path.relpath(f, base).replace(os.sep, "/") for f in files)


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --- discover ------------------------------------------------------------------------------------


def test_folder_walk_finds_py_only_and_keeps_given_prefix(cwd):
    touch(cwd / "src" / "a.py")
    touch(cwd / "src" / "pkg" / "b.py")
    touch(cwd / "src" / "pkg" / "c.pyi")
    touch(cwd / "src" / "notes.txt")
    touch(cwd / "src" / ".hidden" / "d.py")  # hidden folders are not skipped
    touch(cwd / "src" / "__pycache__" / "e.py")
    touch(cwd / "src" / ".git" / "f.py")
    touch(cwd / "src" / ".venv" / "lib" / "g.py")  # nor virtualenvs (unless gitignored / excluded)
    files, errors = discover(["src/"], Settings())
    assert errors == []
    assert files == ["src/.hidden/d.py", "src/.venv/lib/g.py", "src/a.py", "src/pkg/b.py"]
    files, _ = discover(["./src"], Settings())
    assert files[0] == "./src/.hidden/d.py"


def test_explicit_files_any_extension_and_dedup(cwd):
    touch(cwd / "script")
    touch(cwd / "a.py")
    files, errors = discover(["script", "a.py", "./a.py", "."], Settings())
    assert errors == []
    assert files == ["script", "a.py"]


def test_missing_path(cwd):
    touch(cwd / "a.py")
    files, errors = discover(["nope.py", "a.py"], Settings())
    assert files == ["a.py"]
    assert [(e.path, e.message) for e in errors] == [("nope.py", "No such file or directory")]


def test_empty_folder(cwd):
    (cwd / "empty").mkdir()
    touch(cwd / "only_text" / "x.txt")
    files, errors = discover(["empty", "only_text"], Settings())
    assert files == []
    assert [(e.path, e.message) for e in errors] == [("empty", "no Python files found"), ("only_text", "no Python files found")]


def test_symlink_loop_is_reported_not_followed(cwd):
    touch(cwd / "proj" / "sub" / "a.py")
    os.symlink("..", cwd / "proj" / "sub" / "up")
    os.symlink("self.py", cwd / "proj" / "self.py")  # a link to itself
    files, errors = discover(["proj"], Settings())
    assert files == ["proj/sub/a.py"]
    messages = {e.path: e.message for e in errors}
    assert messages["proj/sub/up"].startswith("symlink loop")
    assert messages["proj/self.py"].startswith("symlink loop")
    assert all("\n" not in m for m in messages.values())


def test_symlinked_folder_followed_once(cwd):
    touch(cwd / "real" / "a.py")
    (cwd / "tree").mkdir()
    os.symlink(cwd / "real", cwd / "tree" / "link1")
    os.symlink(cwd / "real", cwd / "tree" / "link2")
    files, errors = discover(["tree"], Settings())
    assert errors == []
    assert files == ["tree/link1/a.py"]


def test_broken_symlink(cwd):
    (cwd / "d").mkdir()
    os.symlink("gone.py", cwd / "d" / "broken.py")
    os.symlink("gone.py", cwd / "top.py")
    files, errors = discover(["d", "top.py"], Settings())
    assert files == []
    assert [(e.path, e.message) for e in errors] == [("d/broken.py", "broken symbolic link"), ("top.py", "broken symbolic link")]


def test_gitignore_nested_and_negated(cwd):
    (cwd / "repo" / ".git").mkdir(parents=True)
    touch(cwd / "repo" / ".gitignore", "build/\n*_gen.py\n")
    touch(cwd / "repo" / ".git" / "info" / "exclude", "scratch.py\n")
    touch(cwd / "repo" / "a.py")
    touch(cwd / "repo" / "scratch.py")
    touch(cwd / "repo" / "build" / "b.py")
    touch(cwd / "repo" / "x_gen.py")
    touch(cwd / "repo" / "pkg" / ".gitignore", "!keep_gen.py\nlocal.py\n")
    touch(cwd / "repo" / "pkg" / "keep_gen.py")
    touch(cwd / "repo" / "pkg" / "drop_gen.py")
    touch(cwd / "repo" / "pkg" / "local.py")
    touch(cwd / "repo" / "other" / "local.py")  # the nested .gitignore does not reach here
    files, errors = discover(["repo"], Settings())
    assert errors == []
    assert names(files, "repo") == ["a.py", "other/local.py", "pkg/keep_gen.py"]
    # Walking a subfolder still honours the repository's .gitignore files above it.
    files, _ = discover(["repo/pkg"], Settings())
    assert names(files, "repo/pkg") == ["keep_gen.py"]
    # respect-gitignore = false
    files, _ = discover(["repo"], Settings(respect_gitignore=False))
    assert len(files) == 8


def test_folder_that_is_itself_gitignored_is_still_checked(cwd):
    # e.g. `graphify check .venv/lib/python3.11/site-packages/torch`, or pyenv's versions/ folder
    (cwd / "repo" / ".git").mkdir(parents=True)
    touch(cwd / "repo" / ".gitignore", "/versions/\n*.log\n")
    touch(cwd / "repo" / "versions" / "torch" / "nn.py")
    touch(cwd / "repo" / "versions" / "torch" / ".gitignore", "gen.py\n")
    touch(cwd / "repo" / "versions" / "torch" / "gen.py")
    files, errors = discover(["repo/versions/torch"], Settings())
    assert errors == []
    assert files == ["repo/versions/torch/nn.py"]


def test_exclude_and_extend_exclude(cwd):
    touch(cwd / "a.py")
    touch(cwd / "legacy" / "b.py")
    touch(cwd / "pkg" / "m_pb2.py")
    touch(cwd / "pkg" / "m.py")
    settings = Settings(exclude=["legacy/"], extend_exclude=["*_pb2.py"], root=str(cwd))
    files, errors = discover(["."], settings)
    assert errors == []
    assert files == ["./a.py", "./pkg/m.py"]
    # Files named on the command line are checked anyway, unless force_exclude.
    assert discover(["legacy/b.py"], settings)[0] == ["legacy/b.py"]
    assert discover(["legacy/b.py", "pkg/m_pb2.py"], settings, force_exclude=True)[0] == []


def test_exclude_does_not_reach_above_the_walked_folder(cwd):
    touch(cwd / "site-packages" / "torch" / "a.py")
    files, _ = discover(["site-packages/torch"], Settings(exclude=["site-packages"], root=str(cwd / "elsewhere")))
    assert files == ["site-packages/torch/a.py"]


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root reads every folder")
def test_unreadable_folder(cwd):
    touch(cwd / "tree" / "ok.py")
    locked = cwd / "tree" / "locked"
    touch(locked / "x.py")
    locked.chmod(0)
    try:
        files, errors = discover(["tree"], Settings())
    finally:
        locked.chmod(0o755)
    assert files == ["tree/ok.py"]
    assert [(e.path, e.message) for e in errors] == [("tree/locked", "permission denied")]


# --- read_source ---------------------------------------------------------------------------------


def test_read_utf8_and_bom(tmp_path):
    p = tmp_path / "a.py"
    p.write_bytes("\ufeffx = 'é'\r\n".encode("utf-8"))
    assert read_source(str(p)) == "x = 'é'\r\n"


def test_read_with_coding_cookie(tmp_path):
    p = tmp_path / "a.py"
    p.write_bytes("# -*- coding: latin-1 -*-\nx = 'é'\n".encode("latin-1"))
    assert read_source(str(p)).endswith("x = 'é'\n")


def test_latin1_without_cookie(tmp_path):
    p = tmp_path / "a.py"
    p.write_bytes("import torch\nx = 'é'\n".encode("latin-1"))
    with pytest.raises(SourceError) as info:
        read_source(str(p))
    assert info.value.message.startswith("not valid UTF-8 (byte 0xe9 at line 2, column 6)")
    assert "coding" in info.value.message


def test_unknown_encoding(tmp_path):
    p = tmp_path / "a.py"
    p.write_bytes(b"# coding: klingon\nx = 1\n")
    with pytest.raises(SourceError, match=r"^unknown encoding 'klingon' in the coding cookie"):
        read_source(str(p))


def test_cookie_does_not_match_bytes(tmp_path):
    p = tmp_path / "a.py"
    p.write_bytes(b"# coding: ascii\nx = '\xe9'\n")
    with pytest.raises(SourceError, match=r"^not valid ascii as its coding cookie says"):
        read_source(str(p))


def test_binary_file(tmp_path):
    p = tmp_path / "a.py"
    p.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00")
    with pytest.raises(SourceError, match=r"^binary file"):
        read_source(str(p))


def test_huge_file(tmp_path):
    p = tmp_path / "a.py"
    with open(p, "wb") as f:
        f.truncate(MAX_BYTES + 3 * 1024 * 1024)  # sparse: cheap to make
    with pytest.raises(SourceError, match=r"^file too large \(11\.0 MB; the limit is 8 MB\)"):
        read_source(str(p))


def test_missing_and_folder(tmp_path):
    with pytest.raises(SourceError, match="^No such file or directory$"):
        read_source(str(tmp_path / "nope.py"))
    with pytest.raises(SourceError, match="^is a directory$"):
        read_source(str(tmp_path))


def test_permission_denied(tmp_path, monkeypatch):
    p = tmp_path / "a.py"
    p.write_text("x = 1\n")
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        if str(path) == str(p):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    with pytest.raises(SourceError, match="^permission denied$"):
        read_source(str(p))
