"""Jupyter notebooks (`.ipynb`): their code cells read as one Python module, and written back.

The code cells are joined in order into one module, so a loop in one cell sees the model and the
optimizer built in another. IPython syntax that is not Python becomes `pass` on the same line
(line magics `%x`, shell escapes `!x`, help `x?`; `y = !x` becomes `y = None`), and a cell magic
other than a timing one (`%%bash`, `%%writefile`...) blanks its cell, so every line keeps its number.
A `from __future__` import becomes `pass` too: Jupyter compiles each cell on its own, and in the
joined module it would not come first; but for those opening the first code cell, which open the joined
module as well (an import the rewrite adds goes after them).
Cells are numbered from 1 among code cells, as ruff numbers them: `train.ipynb:cell 3:12:5`.

`Notebook.with_source(new)` maps a rewrite of the joined module back onto the cells: only cells whose
code changed are written, outputs, metadata and the other cells stay byte for byte in the JSON, and a
change that would span two cells, or touch IPython syntax, is refused (`CellSpanError`).
"""

from __future__ import annotations

import bisect
import json
import re
import sys
from dataclasses import dataclass
from functools import cached_property
from json.decoder import scanstring

from graphify.files import MAX_BYTES, SourceError, is_notebook, read_source, source_from_bytes

NOTEBOOK_MAX_BYTES = 16 * MAX_BYTES  # outputs (plots, tables) make notebooks large; the code limit stays MAX_BYTES

_TIMING_CELL_MAGICS = {"time", "timeit", "capture", "prun"}  # their body is Python and runs
_MAGIC_LINE = re.compile(r"^(\s*)([%!?]|[^#\s].*\?\s*$)")
_SHELL_ASSIGNMENT = re.compile(r"^(\s*[\w.\[\], ]+=\s*)[!%].*$")
_FUTURE_IMPORT = re.compile(r"from\s+__future__\s+import\b")


class CellSpanError(Exception):
    """A rewrite that cannot be written back cell by cell; str(exc) says why."""


@dataclass
class Notebook:
    text: str  # the file as read
    data: dict  # its parsed JSON
    cell_indexes: list[int]  # position in data["cells"] of each code cell
    raw: list[list[str]]  # each code cell's lines as written (newline-terminated)
    python: list[list[str]]  # the same lines with IPython syntax made Python
    starts: list[int]  # the module line (1-based) where each code cell begins

    def file_line(self, cell: int, line: int) -> int:
        """The line of the .ipynb file itself that holds line `line` of code cell `cell` (both from 1): where
        a viewer of the file (SARIF, GitHub annotations) shows that code. A cell stored as one string is one
        line of the file."""
        source = self._source_offsets[self.cell_indexes[cell - 1]]
        if isinstance(source, int):
            return self.text.count("\n", 0, source) + 1
        pieces = self.data["cells"][self.cell_indexes[cell - 1]]["source"]
        ends, total = [], 0
        for piece in pieces:
            total += len(piece)
            ends.append(total)
        start = sum(len(text) for text in self.raw[cell - 1][: line - 1])  # the line's offset in the cell's code
        piece = min(bisect.bisect_right(ends, start), len(pieces) - 1)
        return self.text.count("\n", 0, source[piece]) + 1

    @cached_property
    def _source_offsets(self) -> list:
        """For each cell, where its `source` string (or each string of its list) starts in the file."""
        return [cell["source"] if isinstance(cell, dict) else None for cell in _offsets(self.text)[0]["cells"]]

    @property
    def source(self) -> str:
        return "".join(line for cell in self.python for line in cell)

    def cell_text(self, cell: int, lines: list[str] | None = None) -> str:
        """Cell `cell` (from 0) as the JSON holds it: no newline added after its last line."""
        text = "".join(self.raw[cell] if lines is None else lines)
        source = self.data["cells"][self.cell_indexes[cell]].get("source", "")
        original = "".join(source) if isinstance(source, list) else source
        return text if original.endswith("\n") else text.removesuffix("\n")

    def with_source(self, new_source: str) -> tuple[str, dict[int, tuple[str, str]]]:
        """The notebook's text with the joined module replaced by `new_source`, and for each changed
        cell (from 1) its code before and after."""
        cells = self._split(new_source.splitlines(keepends=True))
        changed = {}
        data = json.loads(self.text)
        for i, lines in enumerate(cells):
            before, after = self.cell_text(i), self.cell_text(i, lines)
            if before != after:
                changed[i + 1] = (before, after)
                cell = data["cells"][self.cell_indexes[i]]
                cell["source"] = after.splitlines(keepends=True) if isinstance(cell.get("source"), list) else after
        if not changed:
            return self.text, {}
        return _dump_like(data, self.text), changed

    def _split(self, new_lines: list[str]) -> list[list[str]]:
        import difflib  # only a rewrite maps lines back to cells: a check need not import it

        old = [line for cell in self.python for line in cell]
        owner = [i for i, cell in enumerate(self.python) for _ in cell]
        raw = [line for cell in self.raw for line in cell]
        cells: list[list[str]] = [[] for _ in self.python]
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new_lines, autojunk=False).get_opcodes():
            if tag == "equal":
                for i in range(i1, i2):
                    cells[owner[i]].append(raw[i])
                continue
            touched = {owner[i] for i in range(i1, i2)}
            if any(raw[i] != old[i] for i in range(i1, i2)):
                raise CellSpanError(f"the rewrite would change IPython syntax in cell {owner[i1] + 1}")
            if not touched:
                touched = {self._insertion_cell(owner, i1, new_lines[j1:j2])}
            if len(touched) > 1:
                first, last = min(touched) + 1, max(touched) + 1
                raise CellSpanError(f"the rewrite would change cells {first} to {last} together")
            cells[touched.pop()].extend(new_lines[j1:j2])
        for raw_cell, cell in zip(self.raw, cells):  # a cell magic stays the cell's first line
            if raw_cell and raw_cell[0].startswith("%%") and cell and cell[0] != raw_cell[0] and raw_cell[0] in cell:
                cell.remove(raw_cell[0])
                cell.insert(0, raw_cell[0])
        return cells

    @staticmethod
    def _insertion_cell(owner: list[int], at: int, inserted: list[str]) -> int:
        """Lines inserted between two cells go with the cell after them (the loop they set up), except
        imports, which join the cell before (where the imports are)."""
        if not owner:
            raise CellSpanError("the notebook has no code cell to write into")
        if at == 0 or at == len(owner) or owner[at - 1] == owner[at]:
            return owner[at] if at < len(owner) else owner[-1]
        code = [line.strip() for line in inserted if line.strip()]
        is_import = all(line.startswith(("import ", "from ")) for line in code)
        return owner[at - 1] if is_import else owner[at]


def read_notebook(path: str, text: str | None = None) -> Notebook:
    """Read a notebook; SourceError (one line) when it is not a notebook or a cell is not Python."""
    text = read_source(path, NOTEBOOK_MAX_BYTES) if text is None else text
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"not a Jupyter notebook: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        version = data.get("nbformat") if isinstance(data, dict) else None
        raise SourceError(f"not a Jupyter notebook of format 4 (no `cells` list{f'; nbformat {version}' if version else ''})")
    language = (data.get("metadata") or {}).get("language_info", {}).get("name", "python")
    indexes = [i for i, c in enumerate(data["cells"]) if isinstance(c, dict) and c.get("cell_type") == "code"]
    if str(language).lower() != "python":  # an R or Julia notebook: nothing of ours to check
        indexes = []
    raw, python, starts, line = [], [], [], 1
    for number, index in enumerate(indexes, 1):
        source = data["cells"][index].get("source", "")
        if not (isinstance(source, str) or (isinstance(source, list) and all(isinstance(s, str) for s in source))):
            raise SourceError(f"not a valid notebook: code cell {number}'s `source` is not text or a list of lines")
        code = "".join(source) if isinstance(source, list) else source
        lines = code.splitlines(keepends=True)
        if lines and not lines[-1].endswith(("\n", "\r")):
            lines[-1] += "\n"
        converted = _as_python(lines, number)
        starts.append(line)
        line += len(lines)
        raw.append(lines)
        python.append(converted)
    notebook = Notebook(text, data, indexes, raw, python, starts)
    if len(notebook.source.encode("utf-8")) > MAX_BYTES:
        raise SourceError(f"notebook code too large (over {MAX_BYTES // 1024 // 1024} MB)")
    return notebook


def _as_python(lines: list[str], number: int) -> list[str]:
    """Cell `number`'s lines as Python: as written when they compile, else with IPython syntax made
    `pass`; SourceError (with Python's message) when even that is not Python."""
    magic = lines[0][2:].split(maxsplit=1)[0] if lines and lines[0].startswith("%%") and lines[0][2:].strip() else None
    if lines and lines[0].startswith("%%") and magic not in _TIMING_CELL_MAGICS:
        return ["\n"] * len(lines)
    head = ["\n"] if lines and lines[0].startswith("%%") else []  # a timing cell magic: its body is Python
    body = _without_future_imports(lines[len(head) :], opening=number == 1 and not head)
    if _syntax_error(head + body) is None:
        return head + body
    converted = head + [_python_line(line) for line in body]
    error = _syntax_error(converted)
    if error is not None:
        raise SourceError(f"cell {number}: {error}")
    return converted


def _without_future_imports(lines: list[str], opening: bool = False) -> list[str]:
    """`from __future__` imports made `pass`, each line kept: Jupyter compiles each cell on its own, where
    they come first, but in the joined module they would follow other cells' code (a SyntaxError). What
    they change (annotations evaluated later) is nothing the analysis or the rewrite reads. Those `opening`
    the first code cell stay: they open the joined module too, and an import a rewrite adds goes after them."""
    out, depth, continued = [], 0, False  # an import still open: unclosed parentheses, a trailing backslash
    leading = opening  # among the lines that open the module yet: blank lines, comments, future imports
    for line in lines:
        inside = depth > 0 or continued
        future = inside or _FUTURE_IMPORT.match(line) is not None
        leading = leading and (future or not line.strip() or line.lstrip().startswith("#"))
        if future:
            out.append(line if leading else "\n" if inside else "pass\n")
            depth += line.count("(") - line.count(")")
            continued = line.rstrip().endswith("\\")
        else:
            out.append(line)
    return out


def _python_line(line: str) -> str:
    if m := _SHELL_ASSIGNMENT.match(line):
        return f"{m.group(1)}None\n"
    if m := _MAGIC_LINE.match(line):
        return f"{m.group(1)}pass\n"
    return line


def _syntax_error(lines: list[str]) -> str | None:
    try:
        compile("".join(lines), "<cell>", "exec", dont_inherit=True, flags=0x400)  # PyCF_ONLY_AST
    except SyntaxError as exc:
        return f"syntax error at line {exc.lineno}, column {exc.offset}: {exc.msg}"
    except ValueError as exc:
        return str(exc)
    return None


_SPACE = re.compile(r"[ \t\n\r]*")
_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null")


def _offsets(text: str, at: int = 0) -> tuple[object, int]:
    """The JSON value at `at` with each string in it replaced by the offset of its opening quote, and the
    offset after the value (json.loads tells no positions)."""
    at = _SPACE.match(text, at).end()
    opening = text[at]
    if opening == '"':
        return at, scanstring(text, at + 1)[1]
    if opening not in "[{":
        return None, _SCALAR.match(text, at).end()
    closing, items = ("]", []) if opening == "[" else ("}", {})
    at = _SPACE.match(text, at + 1).end()
    while text[at] != closing:
        if opening == "{":
            key, at = scanstring(text, _SPACE.match(text, at).end() + 1)
            items[key], at = _offsets(text, _SPACE.match(text, at).end() + 1)  # after the colon
        else:
            value, at = _offsets(text, at)
            items.append(value)
        at = _SPACE.match(text, at).end()
        at += text[at] == ","
        at = _SPACE.match(text, at).end()
    return items, at + 1


def _dump_like(data: dict, original: str) -> str:
    """JSON in the original file's layout (indent, escaping, line endings, final newline), as nbformat
    writes it. JSON escapes the newlines inside strings: every newline dumped is one of the layout's."""
    second = original.splitlines()[1] if original.count("\n") else ""
    indent = len(second) - len(second.lstrip(" ")) or None
    ascii_only = "\\u" in original and original.isascii()
    text = json.dumps(data, indent=indent, ensure_ascii=ascii_only, separators=(",", ": ") if indent else None)
    text = text + "\n" if original.endswith("\n") else text
    return text.replace("\n", "\r\n") if "\r\n" in original else text


def load_module(path: str, text: str | None = None) -> tuple[str, list[int] | None]:
    """The Python module to analyse for a path (a notebook's joined cells), and for a notebook the
    line where each of its code cells begins; SourceError when it cannot be read."""
    if is_notebook(path):
        notebook = read_notebook(path, text)
        return notebook.source, notebook.starts
    return (read_source(path) if text is None else text), None


def read_stdin(name: str) -> str:
    """Standard input read as the file `name` is (a script or, by its suffix, a notebook): its bytes
    decoded as Python decodes source (a coding cookie, a BOM, else UTF-8), NUL bytes and oversize
    refused (SourceError)."""
    limit = NOTEBOOK_MAX_BYTES if is_notebook(name) else MAX_BYTES  # as read_source reads either
    return source_from_bytes(sys.stdin.buffer.read(limit + 1), limit)
