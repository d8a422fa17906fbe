"""Reads the expectations written into fixtures/check: `# expect: CODE, CODE` on a diagnostic's line,
`# loop: KIND VERDICT` on a reported loop's header line."""

from __future__ import annotations

import re
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CHECK = FIXTURES / "check"
REWRITE = FIXTURES / "rewrite"

_EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9, ]+)")
_LOOP = re.compile(r"#\s*loop:\s*(train|inference)\s+([a-z-]+)")


def cases() -> list[Path]:
    """Each fixture: a script, or a folder holding a multi-file fixture (checked as a whole)."""
    return sorted(p for p in CHECK.iterdir() if (p.suffix == ".py" or p.is_dir()) and not p.name.startswith(("_", ".")))


def entry_script(case: Path) -> Path:
    return case / "train.py" if case.is_dir() else case


def expectations(case: Path) -> tuple[set, set]:
    diagnostics, loops = set(), set()
    files = sorted(case.glob("*.py")) if case.is_dir() else [case]
    for f in files:
        for lineno, line in enumerate(f.read_text().splitlines(), 1):
            m = _EXPECT.search(line)
            if m:
                for code in filter(None, (c.strip() for c in m.group(1).split(","))):
                    diagnostics.add((f.name, lineno, code))
            m = _LOOP.search(line)
            if m:
                loops.add((f.name, lineno, m.group(1), m.group(2)))
    return diagnostics, loops


REWRITABLE = ("capturable", "capturable-after-rewrite", "partially-capturable")


def rewritten_script(case: Path) -> Path:
    """The file of a fixture that holds its rewritable loops: the entry script, or in a folder the
    module that does (a library module's per-epoch function)."""
    names = {name for name, *_, verdict in expectations(case)[1] if verdict in REWRITABLE}
    if not case.is_dir() or "train.py" in names or not names:
        return entry_script(case)
    (name,) = names
    return case / name
