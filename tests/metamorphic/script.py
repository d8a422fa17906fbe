"""A script's source with its `ast`, and exact text edits at the positions `ast` gives.

The transformations locate code with `ast` (a parse takes a millisecond, libcst's fifty times more) and edit the
text in place, so that comments, layout and everything not edited stay byte for byte."""

from __future__ import annotations

import ast
import io
import tokenize
from functools import cached_property, lru_cache

INDENT = "    "


class Script:
    def __init__(self, source: str):
        self.source = source
        self.data = source.encode()  # ast columns count UTF-8 bytes
        self.tree = ast.parse(source)
        self.nodes = list(ast.walk(self.tree))
        self.line_starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.line_starts.append(self.line_starts[-1] + len(line))
        self.parents = {id(child): node for node in self.nodes for child in ast.iter_child_nodes(node)}

    def of(self, *types: type) -> list:
        return [n for n in self.nodes if isinstance(n, types)]

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def offset(self, line: int, column: int) -> int:
        return self.line_starts[line - 1] + column

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def text(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode()

    def lines(self, first: int, last: int) -> tuple[int, int]:
        """The byte span of whole lines first..last."""
        return self.line_starts[first - 1], self.line_starts[last]

    def indent_of(self, node: ast.AST) -> str:
        start = self.line_starts[node.lineno - 1]
        line = self.data[start : self.offset(node.lineno, node.col_offset)].decode()
        return line if not line.strip() else ""

    @cached_property
    def identifiers(self) -> set[str]:
        """Every identifier token, keywords included: a new name must be none of them."""
        tokens = tokenize.generate_tokens(io.StringIO(self.source).readline)
        return {t.string for t in tokens if t.type == tokenize.NAME}

    def edit(self, edits: list[tuple[int, int, str]]) -> str | None:
        """The source with each (start, end, text) byte span replaced; None when there is nothing to replace or
        two spans overlap."""
        if not edits:
            return None
        data, last = self.data, len(self.data) + 1
        for start, end, text in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
            if end > last:
                return None
            data, last = data[:start] + text.encode() + data[end:], start
        return data.decode()


@lru_cache(maxsize=4)
def script(source: str) -> Script:
    """The parsed script, shared by the transformations applied to the same source (none changes it)."""
    return Script(source)


def dotted(node: ast.AST) -> str | None:
    """`torch.optim.Adam` for that attribute chain, None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def innermost_call(node: ast.AST) -> ast.Call | None:
    """The call a method chain starts from: `Net(...)` in `Net(...).to(device).train()`."""
    while isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call):
            node = node.func.value
        else:
            return node
    return None


def is_method_call(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name


def has_backward(node: ast.AST) -> bool:
    return any(is_method_call(n, "backward") for n in ast.walk(node))


def _body_has_backward(loop: ast.For | ast.While) -> bool:
    return any(has_backward(stmt) for stmt in loop.body)


def step_loops(s: Script) -> list[ast.For | ast.While]:
    """The innermost loops whose own body runs a backward pass: the training loops as written."""
    found = [loop for loop in s.of(ast.For, ast.While) if _body_has_backward(loop)]
    return [
        loop
        for loop in found
        if not any(
            o is not loop and _body_has_backward(o) for stmt in loop.body for o in ast.walk(stmt) if isinstance(o, (ast.For, ast.While))
        )
    ]


def has_multiline_string(s: Script, first: int, last: int) -> bool:
    """Whether a string literal spanning lines sits in lines first..last (re-indenting would change it)."""
    return any(
        isinstance(n, (ast.Constant, ast.JoinedStr)) and n.lineno != n.end_lineno and first <= n.lineno <= last
        for n in s.nodes
        if hasattr(n, "lineno")
    )


def indented(s: Script, first: int, last: int, prefix: str = INDENT) -> str:
    """Lines first..last with `prefix` added before each non-blank one."""
    start, end = s.lines(first, last)
    return "".join(prefix + line if line.strip() else line for line in s.data[start:end].decode().splitlines(keepends=True))


def first_code_line(s: Script) -> int:
    """Index into the module body of the first statement after its docstring, `from __future__` and leading imports."""
    body, index = s.tree.body, 0
    for i, stmt in enumerate(body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            index = 1
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            index = i + 1
        else:
            break
    return index


def after_imports(s: Script) -> int:
    """The byte offset where code added after the leading imports goes (the start of the next line)."""
    body = s.tree.body
    index = first_code_line(s)
    return s.lines(1, body[index - 1].end_lineno)[1] if index else 0
