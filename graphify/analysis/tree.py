"""Fast child access. libcst computes `node.children` with a visitor on every call; the analysis walks
the same trees many times and never looks at whitespace, punctuation or operator tokens, so children
come straight from each node's fields (in source order), without those tokens, memoised while a
module is analysed.

The hottest loops of the analysis test exact types (`type(n) is cst.Call`) rather than isinstance,
which goes through ABCMeta on libcst's classes and is ten times slower: none of libcst's node classes
has a subclass (tests/test_libcst_assumptions.py), so the answers are the same."""

from __future__ import annotations

import ast

import dataclasses

import libcst as cst

_TOKENS = (
    cst.BaseParenthesizableWhitespace,
    cst.Comment,
    cst.EmptyLine,
    cst.Newline,
    cst.TrailingWhitespace,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.Comma,
    cst.Dot,
    cst.Colon,
    cst.Semicolon,
    cst.AssignEqual,
    cst.BaseUnaryOp,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseAugOp,
)
_FIELDS: dict[type, tuple[str, ...]] = {}
_WANTED: dict[type, bool] = {}
_CACHE: dict[int, tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]] = {}


def _fields(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _wanted(cls: type) -> bool:
    """A syntax node the analysis looks at. Cached, and read from the class's MRO: issubclass on
    libcst's abstract classes walks all their subclasses the first time it answers no (libcst
    registers no virtual subclasses, so the MRO gives the same answer)."""
    wanted = _WANTED.get(cls)
    if wanted is None:
        bases = set(cls.__mro__)
        wanted = _WANTED[cls] = cst.CSTNode in bases and bases.isdisjoint(_TOKENS)
    return wanted


def children(node: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
    hit = _CACHE.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    kids = []
    for name in _fields(type(node)):
        value = getattr(node, name)
        if type(value) in (list, tuple):
            kids.extend(v for v in value if _wanted(type(v)))
        elif _wanted(type(value)):
            kids.append(value)
    kids = tuple(kids)
    _CACHE[id(node)] = (node, kids)
    return kids


_MEMOS: list[dict] = [_CACHE]


def memo() -> dict:
    """A per-module memo of node facts, keyed by id(node); `forget()` clears it with the others."""
    table: dict = {}
    _MEMOS.append(table)
    return table


def forget() -> None:
    """Drop the memos (between modules), so a long run does not keep old trees alive."""
    for table in _MEMOS:
        table.clear()


def simple_statements(body: cst.CSTNode):
    """The simple statement lines of a function or module body, nested functions and classes left out."""
    stack = list(children(body))
    while stack:
        node = stack.pop()
        if type(node) is cst.SimpleStatementLine:
            yield node
        elif type(node) not in (cst.FunctionDef, cst.ClassDef) and not isinstance(node, cst.BaseSmallStatement):
            stack.extend(children(node))


def returns(fn: cst.FunctionDef):
    """The `return value` statements of a function, not those of functions nested in it."""
    stack = list(children(fn.body))
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Return) and node.value is not None:
            yield node
        elif not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            stack.extend(children(node))


def descendants(node: cst.CSTNode):
    """Every node under `node` (its own included), into nested functions and classes too (`walk` stops at them)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(children(n))


def nested_too_deep(source: str) -> bool:
    """Whether Python's own parser, which guards its depth, finds the code nested beyond its limit: run
    before libcst's native parser, which would overflow the C stack there (a crash, not an error). A
    syntax error is left to libcst, whose message says more (and which reads newer syntax)."""
    try:
        compile(source, "<graphify>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except (RecursionError, MemoryError):
        return True
    except Exception:  # noqa: BLE001 - SyntaxError, ValueError (NUL bytes): libcst reports them
        return False
    return False
