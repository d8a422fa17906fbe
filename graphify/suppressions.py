"""`# graphify: ignore[GFY001, GFY511]`, bare `# graphify: ignore`, `# noqa: GFY001` and
`# graphify: ignore-file` comments.

* A trailing comment applies to its own line.
* A comment on a line of its own applies to the next line of code (blank and comment lines are
  skipped, so several own-line comments can stack above one statement).
* When that line starts a statement that spans several lines (a call split over lines, a
  parenthesised expression...), the comment covers every line of the statement. A compound
  statement's header (`for ...:`, `with ...:`) is a statement of its own: its body is not covered.
* Codes may be full codes or prefixes (`GFY0`); free text may follow the brackets
  (`# graphify: ignore[GFY006] -- logged once per epoch on purpose`).
* `# noqa: GFY001, E501` is read as `# graphify: ignore[GFY001]` (its GFY codes only; a bare `# noqa`
  or one without GFY codes is left to the other linters).
* `# graphify: ignore-file` anywhere in a file suppresses every diagnostic in it.

Comments are found with the tokenize module, so `"# graphify: ignore"` inside a string is not a
suppression. Sources that never mention `graphify:` are not tokenized at all, and the others only
when the first diagnostic is looked up.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from typing import Iterable

from graphify.model import FileError

# an unclosed `ignore[` suppresses nothing: read as bare, it would silence every rule on the line
_DIRECTIVE = re.compile(r"#\s*graphify:\s*ignore\b(?!-)(?:\s*\[([^\]\n]*)\]|(?!\s*\[))")
_NOQA = re.compile(r"#\s*noqa\s*:\s*([A-Za-z0-9_, ]+)", re.I)
_NOQA_GFY = re.compile(r"noqa\s*:[^\n]*GFY", re.I)  # a cheap test before tokenizing
_FILE = re.compile(r"#\s*graphify:\s*ignore-file\b")
_ALL = "ALL"
_SKIP = frozenset({tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING})


class Suppressions:
    """Which codes are suppressed on which lines of one source."""

    def __init__(self, source: str | None = None) -> None:
        self._source = source
        self._by_line: dict[int, frozenset[str]] | None = None if source is not None else {}

    def suppressed(self, code: str, line: int) -> bool:
        codes = self.by_line.get(line) or self.by_line.get(0)
        if not codes:
            return False
        return _ALL in codes or any(code.startswith(c) for c in codes)

    @property
    def by_line(self) -> dict[int, frozenset[str]]:
        """Line (1-based) -> suppressed codes or prefixes (`"ALL"` for a bare ignore)."""
        if self._by_line is None:
            self._by_line = _scan(self._source or "")
            self._source = None
        return self._by_line

    def __bool__(self) -> bool:
        return bool(self.by_line)


def parse_suppressions(source: str) -> Suppressions:
    if "graphify:" not in source and not _NOQA_GFY.search(source):
        return Suppressions()
    return Suppressions(source)


@dataclass
class UnknownCode(FileError):
    """A warning for `check`, not an error: it travels with a file's errors (from the worker processes
    too), and the CLI sets it apart."""

    line: int = 0


def unknown_codes(source: str, known: Iterable[str] | None = None) -> list[tuple[int, str]]:
    """(line, code) for each code of a suppression comment that suppresses nothing: neither ALL nor a
    code or prefix of a rule in `known` (default: every registered rule). ruff warns of these likewise."""
    if "graphify:" not in source and not _NOQA_GFY.search(source):
        return []
    if known is None:
        from graphify.rules import rules_by_code

        known = rules_by_code()
    known = tuple(known)
    found = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                for code in _written_codes(tok.string) or ():
                    if code.upper() != _ALL and not any(k.startswith(code.upper()) for k in known):
                        found.append((tok.start[0], code))
    except (tokenize.TokenError, SyntaxError):
        pass  # keep what was read; the analysis reports the syntax error
    return found


def _directive(comment: str) -> frozenset[str] | None:
    """The codes a comment suppresses, or None when it is no suppression of graphify's."""
    codes = _written_codes(comment)
    return None if codes is None else frozenset(c.upper() for c in codes)


def _written_codes(comment: str) -> list[str] | None:
    m = _DIRECTIVE.search(comment)
    if m is not None:
        if m.group(1) is None:
            return [_ALL]
        return [c.strip() for c in m.group(1).split(",") if c.strip()]
    m = _NOQA.search(comment)
    if m is not None:
        codes = [c.strip() for c in m.group(1).split(",") if c.strip().upper().startswith("GFY")]
        return codes or None
    return None


def _scan(source: str) -> dict[int, frozenset[str]]:
    by_line: dict[int, set[str]] = {}
    pending: set[str] = set()  # own-line comments waiting for the next line of code
    stmt_first = 0  # first line of the logical line being read (0: between statements)
    stmt_codes: set[str] = set()  # what covers the whole of that logical line
    last_line = 0  # last line that held a code token of the current logical line

    def cover(first: int, last: int, codes: set[str]) -> None:
        for n in range(first, last + 1):
            by_line.setdefault(n, set()).update(codes)

    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            ttype = tok.type
            if ttype == tokenize.COMMENT:
                if _FILE.search(tok.string):
                    return {0: frozenset({_ALL})}  # line 0: the whole file
                codes = _directive(tok.string)
                if codes is None:
                    continue
                if not tok.line[: tok.start[1]].strip():  # a comment on a line of its own
                    pending |= codes
                else:
                    cover(tok.start[0], tok.start[0], set(codes))
                    if tok.start[0] == stmt_first:
                        stmt_codes |= codes
            elif ttype in _SKIP:
                if ttype == tokenize.NEWLINE and stmt_first:
                    if stmt_codes:
                        cover(stmt_first, max(last_line, tok.start[0]), stmt_codes)
                    stmt_first, stmt_codes = 0, set()
            elif ttype == tokenize.ENDMARKER:
                break
            else:
                if stmt_first == 0:
                    stmt_first = tok.start[0]
                    stmt_codes, pending = pending, set()
                    if stmt_codes:
                        cover(stmt_first, stmt_first, stmt_codes)
                elif pending:  # an own-line comment inside a statement split over lines
                    cover(tok.start[0], tok.start[0], pending)
                    pending = set()
                last_line = tok.end[0]
    except (tokenize.TokenError, SyntaxError):
        pass  # keep what was read; the analysis reports the syntax error
    if stmt_first and stmt_codes:
        cover(stmt_first, last_line, stmt_codes)
    return {line: frozenset(codes) for line, codes in by_line.items()}
