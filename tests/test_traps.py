"""The trap suite (fixtures/traps/): scripts written the way users write them, each carrying one per-step
host dependence or one structure that broke rewrites. Each declares its outcome on an `# outcome:` line:
`rewritten`, `refused GFYxxx` (the loop is left unchanged, with that code among its reasons), or `partial GFYxxx`
(the whole step is refused with that code, and the model's forward and backward replay from graphs).

On the CPU this checks what the rewrite decides; scripts/verify-traps runs the rewritten ones on a GPU.
"""

import re
from pathlib import Path

import libcst as cst
import pytest

from graphify.config import Settings
from graphify.rewrite import rewrite_source

TRAPS = Path(__file__).resolve().parents[1] / "fixtures" / "traps"


def outcome(path: Path) -> tuple[str, str | None]:
    match = re.search(r"^# outcome: (rewritten|(refused|partial) (GFY\d{3}))$", path.read_text(), flags=re.M)
    assert match, f"{path.name} has no outcome line"
    return ("rewritten", None) if match.group(1) == "rewritten" else (match.group(2), match.group(3))


def traps():
    return sorted(p for p in TRAPS.glob("*.py"))


def test_the_suite_is_large_enough():
    kinds = [outcome(p)[0] for p in traps()]
    assert len(kinds) >= 25 and kinds.count("refused") >= 10 and kinds.count("rewritten") >= 10


@pytest.mark.parametrize("path", traps(), ids=lambda p: p.stem)
def test_trap_outcome(path):
    kind, code = outcome(path)
    result = rewrite_source(path.read_text(), str(path), Settings())
    assert not result.errors
    if kind == "rewritten":
        assert result.changed, [o.reasons for o in result.outcomes]
        cst.parse_module(result.code)
        assert "from graphify.runtime import CapturedStep" in result.code
    elif kind == "partial":  # the whole step is refused with that code; the model's forward and backward are graphed
        assert [o.verdict.value for o in result.outcomes] == ["partially-capturable"], [o.reasons for o in result.outcomes]
        assert code in result.outcomes[0].reasons and "GraphedModule" in result.code
    else:
        assert not result.changed, f"{path.name} must be left unchanged ({code})"
        assert any(code in o.reasons for o in result.outcomes), [o.reasons for o in result.outcomes]


def test_suppressions_do_not_change_the_rewrite():
    """`# graphify: ignore[...]` and --ignore change what check reports, never what the rewrite does."""
    for name in ("suppressed_logging_line", "suppressed_real_blocker"):
        source = (TRAPS / f"{name}.py").read_text()
        bare = re.sub(r"\s*# graphify: ignore\[GFY\d+\]", "", source)
        assert bare != source
        with_sup = rewrite_source(source, "t.py", Settings()).code
        without = rewrite_source(bare, "t.py", Settings()).code
        assert re.sub(r"\s*# graphify: ignore\[GFY\d+\]", "", with_sup) == without
        ignoring = rewrite_source(bare, "t.py", Settings(ignore=["ALL"])).code
        assert ignoring == without
