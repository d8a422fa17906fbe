"""`[tool.graphify]` in pyproject.toml -> Settings.

Config is resolved once per run from the nearest pyproject.toml that has a `[tool.graphify]` table,
searching from the first checked path upward. Keys are kebab-case:

    [tool.graphify]
    select = ["ALL"]                    # codes (GFY001), prefixes (GFY0), categories (host-sync), ALL
    ignore = ["GFY5"]
    exclude = ["legacy/"]               # replaces the (empty) default exclude list
    extend-exclude = ["notebooks/*.py"] # added to `exclude`
    respect-gitignore = true
    defer-host-reads = false            # `graphify rewrite`: as --defer-host-reads
    [tool.graphify.per-file-ignores]
    "tests/**" = ["GFY0", "logging-io"]

Globs (exclude, extend-exclude, per-file-ignores): `*` and `?` do not cross `/`, `**` matches any
number of folders, `[...]` is a character class. A glob without a `/` matches a file or folder name
at any depth; a glob with a `/` is anchored at the folder that holds the pyproject.toml (or the
current folder when there is none). A glob that matches a folder matches everything inside it.

CLI flags override the config: `--select` replaces the configured select *and* ignore lists (so
`--select GFY001` turns GFY001 on even when the config ignores it); `--ignore` adds to the
configured ignore list.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from graphify.model import Rule

KNOWN_KEYS = ("select", "ignore", "exclude", "extend-exclude", "per-file-ignores", "respect-gitignore", "defer-host-reads")


class ConfigError(Exception):
    """Bad configuration or bad --select/--ignore value; the CLI prints it and exits 2."""


@dataclass
class Settings:
    select: list[str] = field(default_factory=lambda: ["ALL"])
    ignore: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    extend_exclude: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    respect_gitignore: bool = True
    # Folder that anchors globs with a `/` (the pyproject.toml's folder); None: the current folder.
    root: str | None = None
    # The pyproject.toml the settings came from, for messages; None when defaults are used.
    config_file: str | None = None
    # `graphify rewrite`: host reads after the replay (logging) run one step later (rewrite/deferred.py)
    defer_host_reads: bool = False

    def enabled(self, rule: "Rule", path: str) -> bool:
        """Is `rule` on for the file at `path` (a path as reported: relative to cwd or absolute)?"""
        from graphify.rules import matches

        if not matches(rule, self.select) or matches(rule, self.ignore):
            return False
        if self.per_file_ignores:
            rel = relative_to_root(path, self.root)
            for glob, selectors in self.per_file_ignores.items():
                if matches(rule, selectors) and glob_matches(glob, rel):
                    return False
        return True

    def excluded(self, path: str, is_dir: bool = False, parents: bool = True) -> bool:
        """Does `exclude` / `extend-exclude` match `path` (or, with `parents`, a folder it lies in)?"""
        patterns = (*self.exclude, *self.extend_exclude)
        if not patterns:
            return False
        rel = relative_to_root(path, self.root)
        return any(glob_matches(p, rel, is_dir, parents) for p in patterns)

    def with_cli(
        self, select: Sequence[str] | None = None, ignore: Sequence[str] | None = None, extend_select: Sequence[str] | None = None
    ) -> "Settings":
        """Apply --select / --extend-select / --ignore on top of the config (see the module docstring)."""
        new = replace(self)
        if extend_select is not None:
            _check_selectors(extend_select, "--extend-select")
            new.select = [*new.select, *extend_select]
        if select is not None:
            if not select:  # `--select ""`: checking nothing would pass whatever the code (ruff refuses it too)
                raise ConfigError("--select: no rule codes given")
            _check_selectors(select, "--select")
            new.select = list(select)
            new.ignore = []
        if ignore is not None:
            _check_selectors(ignore, "--ignore")
            new.ignore = [*new.ignore, *ignore]
        return new


def split_selectors(value: str | None) -> list[str] | None:
    """`"GFY001, GFY1"` -> `["GFY001", "GFY1"]`; None stays None (flag not given)."""
    if value is None:
        return None
    return [s.strip() for s in value.split(",") if s.strip()]


# --- loading -------------------------------------------------------------------------------------


def load_settings_from(config: str) -> Settings:
    """Settings from the [tool.graphify] table of a given pyproject.toml (--config PATH)."""
    if not os.path.isfile(config):
        raise ConfigError(f"{config}: no such file")
    table = _graphify_table(config)
    if table is None:
        raise ConfigError(f"{config}: no [tool.graphify] table")
    return settings_from_table(table, config)


def load_settings(paths: Sequence[str]) -> Settings:
    """Settings from the nearest pyproject.toml with a [tool.graphify] table above paths[0]."""
    start = os.path.abspath(paths[0] if paths else ".")
    if not os.path.isdir(start):
        start = os.path.dirname(start)
    folder = start
    while True:
        candidate = os.path.join(folder, "pyproject.toml")
        table = _graphify_table(candidate) if os.path.isfile(candidate) else None
        if table is not None:
            return settings_from_table(table, candidate)
        parent = os.path.dirname(folder)
        if parent == folder:
            return Settings()
        folder = parent


def _graphify_table(pyproject: str) -> dict | None:
    try:
        with open(pyproject, "rb") as f:
            data = f.read()
    except OSError as exc:  # it may hold the table: going on without it would check with other rules
        reason = "permission denied" if isinstance(exc, PermissionError) else exc.strerror or str(exc)
        raise ConfigError(f"{pyproject}: cannot read it: {reason}") from None
    if b"graphify" not in data:  # skip parsing the many pyproject.toml files that cannot have the table
        return None
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{pyproject}: invalid TOML: {exc}") from None
    tool = doc.get("tool")
    table = tool.get("graphify") if isinstance(tool, dict) else None
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: [tool.graphify] must be a table")
    return table


def settings_from_table(table: dict, config_file: str = "pyproject.toml") -> Settings:
    """Validate a [tool.graphify] table and turn it into Settings (raises ConfigError)."""
    where = f"{config_file}: [tool.graphify]"
    for key in table:
        if key not in KNOWN_KEYS:
            hint = _did_you_mean(key.replace("_", "-"), KNOWN_KEYS)
            raise ConfigError(f"{where}: unknown key '{key}'{hint}; known keys: {', '.join(KNOWN_KEYS)}")
    settings = Settings(root=os.path.dirname(os.path.abspath(config_file)), config_file=config_file)
    if "select" in table:
        settings.select = _str_list(table["select"], f"{where} select")
        _check_selectors(settings.select, f"{where} select")
    if "ignore" in table:
        settings.ignore = _str_list(table["ignore"], f"{where} ignore")
        _check_selectors(settings.ignore, f"{where} ignore")
    if "exclude" in table:
        settings.exclude = _str_list(table["exclude"], f"{where} exclude")
    if "extend-exclude" in table:
        settings.extend_exclude = _str_list(table["extend-exclude"], f"{where} extend-exclude")
    for key in ("respect-gitignore", "defer-host-reads"):
        if key in table:
            if not isinstance(table[key], bool):
                raise ConfigError(f"{where} {key}: expected true or false")
            setattr(settings, key.replace("-", "_"), table[key])
    if "per-file-ignores" in table:
        pfi = table["per-file-ignores"]
        if not isinstance(pfi, dict):
            raise ConfigError(f'{where} per-file-ignores: expected a table of glob = ["GFY001", ...]')
        for glob, selectors in pfi.items():
            what = f"{where} per-file-ignores '{glob}'"
            settings.per_file_ignores[glob] = _str_list(selectors, what)
            _check_selectors(settings.per_file_ignores[glob], what)
    for glob in (*settings.exclude, *settings.extend_exclude, *settings.per_file_ignores):
        try:
            _compile_glob(glob)
        except re.error as exc:
            raise ConfigError(f"{where}: invalid glob '{glob}': {exc}") from None
    return settings


def _str_list(value, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{what}: expected a list of strings, got {value!r}")
    return list(value)


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _check_selectors(selectors: Iterable[str], what: str) -> None:
    from graphify.rules import CATEGORIES, all_rules

    codes = [r.code for r in all_rules()]
    for sel in selectors:
        s = sel.strip()
        if s.upper() == "ALL" or s in CATEGORIES:
            continue
        if s.upper().startswith("GFY") and any(code.startswith(s.upper()) for code in codes):
            continue
        hint = _did_you_mean(s.upper() if s.upper().startswith("GFY") else s, [*codes, *CATEGORIES])
        raise ConfigError(
            f"{what}: unknown rule selector '{sel}'{hint}; expected a rule code (GFY001), a code prefix (GFY0), "
            f"a category (host-sync) or ALL; `graphify rules` lists them"
        )


# --- globs ---------------------------------------------------------------------------------------


def relative_to_root(path: str, root: str | None) -> str:
    """`path` as a `/`-separated path relative to `root` (or the current folder) when it lies inside."""
    absolute = os.path.abspath(path)
    base = root or os.getcwd()
    rel = os.path.relpath(absolute, base) if os.path.splitdrive(absolute)[0] == os.path.splitdrive(base)[0] else absolute
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        rel = absolute.lstrip(os.sep)
    return rel.replace(os.sep, "/")


def glob_matches(pattern: str, rel_path: str, is_dir: bool = False, parents: bool = True) -> bool:
    """Does the glob match `rel_path` or (with `parents`) a folder it lies in? (see the module docstring)"""
    dir_only, regex = _compile_glob(pattern)
    parts = rel_path.split("/")
    # The path itself, then each parent folder (a glob that matches a folder covers its contents).
    for n in range(len(parts), 0 if parents else len(parts) - 1, -1):
        if dir_only and n == len(parts) and not is_dir:
            continue
        if regex(parts[n - 1] if "/" not in pattern.strip("/") else "/".join(parts[:n])):
            return True
    return False


@functools.lru_cache(maxsize=None)
def _compile_glob(pattern: str) -> tuple[bool, Callable[[str], object]]:
    dir_only = pattern.endswith("/")
    body = pattern.strip("/") if "/" in pattern.strip("/") else pattern.rstrip("/")
    body = body.lstrip("/")
    out = []
    i = 0
    while i < len(body):
        c = body[i]
        if body.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif body.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = body.find("]", i + 2 if body[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end < 0:
                out.append(re.escape(c))
                i += 1
            else:
                cls = body[i + 1 : end]
                if cls.startswith("!"):
                    cls = "^" + cls[1:]
                out.append("[" + cls.replace("\\", "\\\\") + "]")
                i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return dir_only, re.compile("".join(out) + r"\Z", re.DOTALL).match
