"""Line and column of a module's nodes, equal to libcst's PositionProvider.

The provider builds a CodeRange for each of the module's thousands of nodes while it generates the
code; the analysis asks for a few dozen (loops and findings). Here the same code generation notes
only where each node's tokens start and end, and a node's CodeRange is built when it is asked for:
the pass costs about a third of the provider's.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange

# libcst's own line breaks (position_provider.NEWLINE_RE): \r\n, \r or \n
_NEWLINE = re.compile(r"\r\n?|\n")


class _TokenSpans(CodegenState):
    """A code generation that records, per node, the indexes of its first and past-last tokens: of the
    whole node, or of its syntactic part where libcst records one (PositionProvidingCodegenState's
    rules, token indexes in place of positions). Keyed by id(node): libcst nodes hash by identity,
    and Positions keeps the tree alive while it holds this table."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.spans: dict[int, tuple[int, int]] = {}
        self._starts: list[int] = []

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append(len(self.tokens))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._starts.pop()
        if id(node) not in self.spans:  # a syntactic span recorded inside the node wins
            self.spans[id(node)] = (start, len(self.tokens))

    def record_syntactic_position(self, node, *, start_node=None, end_node=None) -> _SyntacticSpan:
        return _SyntacticSpan(self, node, start_node, end_node)

    def pop_trailing_newline(self) -> None:
        """The module's last newline stays: positions were counted with it, and nothing prints these tokens."""


class _SyntacticSpan:
    """The context manager libcst opens around a node's syntactic part; a class, not a generator,
    because libcst opens one for most nodes and this is the pass's hot path."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: _TokenSpans, node, start_node, end_node) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = len(self.state.tokens)

    def __exit__(self, *exc_info) -> None:
        spans = self.state.spans
        start = self.start if self.start_node is None else spans[id(self.start_node)][0]
        end = len(self.state.tokens) if self.end_node is None else spans[id(self.end_node)][1]
        spans[id(self.node)] = (start, end)


class Positions:
    """`positions[node]`: the node's CodeRange, as PositionProvider gives it; KeyError for a node of
    another tree."""

    def __init__(self, module: cst.Module) -> None:
        state = _TokenSpans(module)
        module._codegen(state)
        self._module = module  # the table is keyed by id(node): the tree must outlive it, or a new node could reuse an id
        self._spans = state.spans
        self._offsets = list(accumulate(map(len, state.tokens), initial=0))  # token index -> character offset
        self._line_starts = [0, *(m.end() for m in _NEWLINE.finditer("".join(state.tokens)))]

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        start, end = self._spans[id(node)]
        return CodeRange(self._position(start), self._position(end))

    def _position(self, token_index: int) -> CodePosition:
        offset = self._offsets[token_index]
        line = bisect_right(self._line_starts, offset)
        return CodePosition(line, offset - self._line_starts[line - 1])
