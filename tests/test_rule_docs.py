"""Every registered rule has a complete doc, and the published pages are generated from them."""

import re
from pathlib import Path

import pytest

import graphify.rules
from graphify import docgen
from graphify.rules import all_rules, rule_doc

RULES = all_rules()
SECTIONS = ["What it flags", "Why it breaks capture", "How to fix", "Example", "Suppress"]


def test_codes_unique_and_well_formed():
    codes = [r.code for r in RULES]
    assert len(codes) == len(set(codes))
    assert all(re.fullmatch(r"GFY\d{3}", c) for c in codes), codes


def test_one_module_per_rule():
    """Each rule is one module, named for its code and name, holding its page; every rule module of the
    package is in the registry."""
    for unit in graphify.rules.units():
        code, name = unit.RULE.code, unit.RULE.name
        assert unit.__name__.rsplit(".", 1)[1] == f"{code.lower()}_{name.replace('-', '_')}"
        assert rule_doc(code) == unit.DOC
    package = Path(graphify.rules.__file__).parent
    modules = sorted(".".join(p.relative_to(package).with_suffix("").parts) for p in package.glob("*/gfy*.py"))
    assert modules == sorted(graphify.rules.REGISTRY)


def test_names_unique_kebab_case():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", n) for n in names), names


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_rule_doc(rule):
    doc = rule_doc(rule.code)
    lines = doc.splitlines()
    assert lines[0] == f"# {rule.code} {rule.name}"
    removed = r"(yes|when .+)" if rule.rewritable else "no"
    meta = rf"\*Category: {rule.category} · Severity: {rule.severity.value} · Removed by `graphify rewrite`: {removed}\*"
    assert re.fullmatch(meta, lines[2]), lines[2]
    assert re.findall(r"^## (.+)$", doc, flags=re.M) == SECTIONS
    example = doc.split("## Example", 1)[1].split("## Suppress", 1)[0]
    assert re.search(r"^Flagged:\n```python\n", example, flags=re.M)
    assert re.search(r"^Instead\b.*:\n```python\n", example, flags=re.M)
    assert f"`# graphify: ignore[{rule.code}]`" in doc.split("## Suppress", 1)[1]
    assert len(lines) <= 55, "a rule doc should fit on one screen"
    for block in re.findall(r"```python\n(.*?)```", doc, flags=re.S):
        compile(block, f"{rule.code}.md", "exec")


def test_generated_pages(tmp_path):
    out = tmp_path / "rules"
    (out.parent / "rules").mkdir()
    (out / "GFY999.md").write_text("a page of a rule that is gone")
    assert docgen.main(["--check", str(out)]) == 1
    assert docgen.main([str(out)]) == 0
    assert docgen.outdated(out) == [] and docgen.main(["--check", str(out)]) == 0
    assert sorted(p.stem for p in out.glob("GFY*.md")) == [r.code for r in RULES]
    index = (out / "README.md").read_text()
    assert all(f"| [{r.code}]({r.code}.md) | {r.name} |" in index for r in RULES)
    assert (out / "GFY001.md").read_text().endswith(rule_doc("GFY001"))


# ---- each doc's examples are its test cases ------------------------------------------------------

# Names the examples use without building them, bound the way a script would (only when an example
# does not bind them itself).
_CONTEXT = {
    "model": "model = nn.Linear(4, 2).cuda()",
    "opt": "opt = torch.optim.Adam(model.parameters(), capturable=True)",
    "criterion": "criterion = nn.CrossEntropyLoss()",
    "loader": "loader = DataLoader(dataset, batch_size=32, drop_last=True)",
}
_IMPORTS = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nfrom torch.utils.data import DataLoader\n"


def _examples():
    for rule in RULES:
        example = rule_doc(rule.code).split("## Example", 1)[1].split("## Suppress", 1)[0]
        for kind, code in re.findall(r"^(Flagged|Instead)\b[^\n]*:\n```python\n(.*?)```", example, flags=re.S | re.M):
            yield pytest.param(rule.code, kind, code, id=f"{rule.code}-{kind.lower()}")


@pytest.mark.parametrize("code, kind, example", list(_examples()))
def test_doc_example(code, kind, example):
    """Flagged examples report the rule; Instead examples do not."""
    from graphify.config import Settings
    from graphify.engine import analyze_source

    context = [line for name, line in _CONTEXT.items() if not re.search(rf"^\s*{name}\s*=", example, flags=re.M)]
    source = _IMPORTS + "\n".join(context) + "\n" + example
    found = {d.code for d in analyze_source(source, "example.py", Settings(select=["ALL"])).diagnostics}
    assert (code in found) == (kind == "Flagged"), sorted(found)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_fix_descriptor(rule):
    """A rule the rewrite can remove says how; one it cannot has no fix to apply."""
    from graphify.model import Applicability, FixKind

    assert rule.rewritable == (rule.fix.kind is not FixKind.REFUSED)
    assert (rule.fix.applicability is Applicability.NONE) == (rule.fix.kind is FixKind.REFUSED)
