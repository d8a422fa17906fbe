"""Which files to check, and reading them safely.

`discover(paths, settings)` expands the command-line paths:

* a file is checked as given, whatever its extension (pre-commit passes extensionless scripts);
  with `force_exclude=True`, `exclude` / `extend-exclude` apply to it too;
* a folder is walked recursively for `*.py` and `*.ipynb` (Jupyter notebooks, see notebooks.py),
  skipping `.git`, `__pycache__` and `.ipynb_checkpoints`, what `exclude` /
  `extend-exclude` match, and what `.gitignore` files ignore (the repository's own from its top down
  to the folder, nested ones inside it, and `.git/info/exclude`) unless `respect-gitignore = false`.
  Nothing else is skipped by name: `graphify check .../site-packages/torch` checks that package.
  Symlinked folders are followed once; a link back to a folder being walked is a symlink loop and
  is reported, not followed.

Reported paths are the path as given joined with the part found below it (`src/` + `a/b.py`).
Problems come back as FileError; they never stop the walk.
"""

from __future__ import annotations

import errno
import os
import stat
import tokenize
from typing import Iterator, Sequence

from graphify.config import Settings
from graphify.model import FileError

MAX_BYTES = 8 * 1024 * 1024
ALWAYS_SKIPPED = frozenset({".git", "__pycache__", ".ipynb_checkpoints"})  # the last: Jupyter's autosaved copies
SOURCE_SUFFIXES = (".py", ".ipynb")


class SourceError(Exception):
    """A file that cannot be read as Python source; str(exc) is a one-line message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# --- reading -------------------------------------------------------------------------------------


def read_source(path: str, max_bytes: int = MAX_BYTES) -> str:
    """The text of a Python source file, decoded as Python would decode it (PEP 263 / BOM)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise SourceError(f"file too large ({size / 1024 / 1024:.1f} MB; the limit is {max_bytes // 1024 // 1024} MB)")
            data = f.read(max_bytes + 1)
    except SourceError:
        raise
    except OSError as exc:
        raise SourceError(os_error_message(exc)) from None
    return source_from_bytes(data, max_bytes)


def source_from_bytes(data: bytes, max_bytes: int = MAX_BYTES) -> str:
    """Bytes read from a file or standard input (at most max_bytes + 1 of them) as Python source."""
    if len(data) > max_bytes:  # grew while we read it, or a special file that reports no size
        raise SourceError(f"file too large (over {max_bytes // 1024 // 1024} MB)")
    if b"\0" in data:
        raise SourceError("binary file (contains NUL bytes), not Python source")
    return decode_source(data)


def python_syntax_error(source: str, path: str) -> str | None:
    """Python's own message and position when the source does not compile ("'(' was never closed")."""
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"syntax error at line {exc.lineno}, column {exc.offset}: {exc.msg}"
    except ValueError as exc:  # null bytes
        return str(exc)
    return None


def is_notebook(path: str) -> bool:
    return path.endswith(".ipynb")


def named_files(paths: Sequence[str]) -> set[str]:
    """The paths given as files (not found in a folder): these are parsed even when no loop could be in
    them, so that their syntax errors are reported (folders skip files without training markers unparsed)."""
    return {p for p in paths if os.path.isfile(p) and not is_notebook(p)}


def decode_source(data: bytes) -> str:
    lines = iter(data.splitlines(keepends=True)[:2])
    try:
        encoding, _ = tokenize.detect_encoding(lambda: next(lines, b""))
    except SyntaxError as exc:
        msg = str(exc.msg if hasattr(exc, "msg") else exc)
        if msg.startswith("unknown encoding"):
            name = msg.split(":", 1)[-1].strip()
            raise SourceError(f"unknown encoding '{name}' in the coding cookie (PEP 263)") from None
        raise SourceError(f"bad encoding declaration: {msg}") from None
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        byte = data[exc.start : exc.start + 1].hex()
        if encoding in ("utf-8", "utf-8-sig"):
            raise SourceError(
                f"not valid UTF-8 (byte 0x{byte} at line {line}, column {column}); "
                "save it as UTF-8 or declare its encoding, e.g. `# -*- coding: latin-1 -*-`"
            ) from None
        raise SourceError(f"not valid {encoding} as its coding cookie says (byte 0x{byte} at line {line}, column {column})") from None
    except LookupError:  # pragma: no cover - detect_encoding already checks the codec exists
        raise SourceError(f"unknown encoding '{encoding}' in the coding cookie (PEP 263)") from None
    return text[1:] if text.startswith("\ufeff") else text


def os_error_message(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop (too many levels of symbolic links)"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, IsADirectoryError):
        return "is a directory"
    if exc.strerror:
        return exc.strerror
    return str(exc)


# --- discovery -----------------------------------------------------------------------------------


def discover(paths: Sequence[str], settings: Settings, force_exclude: bool = False) -> tuple[list[str], list[FileError]]:
    files: list[str] = []
    errors: list[FileError] = []
    seen: set[str] = set()

    def add(path: str) -> None:
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            files.append(path)

    for given in paths:
        try:
            st = os.stat(given)
        except OSError as exc:
            errors.append(FileError(given, _stat_error(given, exc)))
            continue
        if stat.S_ISDIR(st.st_mode):
            n_errors = len(errors)
            found = list(_Walker(given, settings, errors).walk())
            if not found and len(errors) == n_errors:
                errors.append(FileError(given, "no Python files found"))
            for path in found:
                add(path)
        elif stat.S_ISREG(st.st_mode):
            if not (force_exclude and settings.excluded(given)):
                add(given)
        else:
            errors.append(FileError(given, "not a regular file or folder"))
    return files, errors


class _Walker:
    def __init__(self, top: str, settings: Settings, errors: list[FileError]) -> None:
        self.top = top
        self.settings = settings
        self.errors = errors
        self.visited: set[tuple[int, int]] = set()
        # (folder, spec) pairs, outermost first; a later (deeper) match wins.
        self.ignores: list[tuple[str, object]] = []

    def walk(self) -> Iterator[str]:
        if self.settings.respect_gitignore:
            self._load_outer_gitignores()
        st = os.stat(self.top)
        yield from self._walk(self.top, os.path.abspath(self.top), [(st.st_dev, st.st_ino)])

    def _walk(self, folder: str, abs_folder: str, ancestors: list[tuple[int, int]]) -> Iterator[str]:
        self.visited.add(ancestors[-1])
        pushed = self.settings.respect_gitignore and self._push_gitignore(abs_folder)
        try:
            try:
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as exc:
                self.errors.append(FileError(folder, os_error_message(exc)))
                return
            for entry in entries:
                if entry.name in ALWAYS_SKIPPED:
                    continue
                path = os.path.join(folder, entry.name)
                abs_path = os.path.join(abs_folder, entry.name)
                try:
                    is_dir = entry.is_dir()
                    is_file = not is_dir and entry.is_file()
                except OSError as exc:
                    self.errors.append(FileError(path, os_error_message(exc)))
                    continue
                if is_dir:
                    if self._skipped(abs_path, True):
                        continue
                    try:
                        st = entry.stat()
                    except OSError as exc:
                        self.errors.append(FileError(path, os_error_message(exc)))
                        continue
                    key = (st.st_dev, st.st_ino)
                    if key in ancestors or (entry.is_symlink() and _contains(os.path.realpath(path), folder)):
                        target = os.readlink(path) if entry.is_symlink() else "?"
                        self.errors.append(
                            FileError(path, f"symlink loop: links back to a folder that contains it ({target}); not followed")
                        )
                    elif key not in self.visited:  # a second link to a folder already walked adds nothing
                        yield from self._walk(path, abs_path, [*ancestors, key])
                elif is_file:
                    if entry.name.endswith(SOURCE_SUFFIXES) and not self._skipped(abs_path, False):
                        yield path
                elif entry.name.endswith(SOURCE_SUFFIXES) and entry.is_symlink() and not self._skipped(abs_path, False):
                    try:
                        os.stat(path)
                    except OSError as exc:  # a dangling link, or a link loop
                        self.errors.append(FileError(path, _stat_error(path, exc)))
        finally:
            if pushed:
                self.ignores.pop()

    def _skipped(self, abs_path: str, is_dir: bool) -> bool:
        # parents=False: the folders above were checked on the way down.
        return self.settings.excluded(abs_path, is_dir, parents=False) or self._gitignored(abs_path, is_dir)

    def _gitignored(self, abs_path: str, is_dir: bool) -> bool:
        ignored = None
        for base, spec in self.ignores:
            rel = os.path.relpath(abs_path, base).replace(os.sep, "/")
            if rel.startswith("../"):
                continue
            result = spec.check_file(rel + "/" if is_dir else rel).include
            if result is not None:
                ignored = result
        return bool(ignored)

    def _push_gitignore(self, abs_folder: str) -> bool:
        spec = _gitignore_spec(os.path.join(abs_folder, ".gitignore"))
        if spec is None:
            return False
        self.ignores.append((abs_folder, spec))
        return True

    def _load_outer_gitignores(self) -> None:
        """.gitignore files from the repository top down to (not including) the walked folder."""
        start = os.path.abspath(self.top)
        chain = []
        folder = os.path.dirname(start)
        git_top = None
        if os.path.exists(os.path.join(start, ".git")):
            git_top = start
        while git_top is None:
            chain.append(folder)
            if os.path.exists(os.path.join(folder, ".git")):
                git_top = folder
                break
            parent = os.path.dirname(folder)
            if parent == folder:
                return  # not inside a git repository: only the .gitignore files below the folder count
            folder = parent
        info = _gitignore_spec(os.path.join(git_top, ".git", "info", "exclude"))
        if info is not None:
            self.ignores.append((git_top, info))
        for folder in reversed(chain):
            self._push_gitignore(folder)
        if self._gitignored(start, True):
            # The folder asked for is itself ignored (a package in an ignored virtualenv, pyenv's
            # versions/...): check it anyway, with only the .gitignore files inside it.
            self.ignores.clear()


def _contains(outer: str, folder: str) -> bool:
    """Is `outer` (a real path) `folder` or one of the folders above it?"""
    inner = os.path.realpath(folder)
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _stat_error(path: str, exc: OSError) -> str:
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return "broken symbolic link"
    return os_error_message(exc)


def _gitignore_spec(path: str):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    import pathspec  # only when there is a .gitignore: it costs ~60 ms to import

    return pathspec.GitIgnoreSpec.from_lines(lines)
