"""Positions computed on demand equal libcst's PositionProvider, node for node."""

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import PositionProvider

from graphify.analysis.positions import Positions
from graphify.notebooks import load_module

ROOT = Path(__file__).resolve().parents[1]

SOURCES = {
    "multi-line statements": (
        "loss = criterion(\n    model(x),\n    y,\n)\n"
        "total = (a +\n         b) * \\\n    c\n"
        "for i, (x, y) in enumerate(\n        loader):\n    opt.step(); opt.zero_grad()\n"
    ),
    "decorators and classes": (
        "import torch\n\n\n@torch.no_grad()\n@ staticmethod\n\n# why\ndef evaluate(model, loader):\n"
        "    for x in loader:\n        model(x)\n\n\nclass Trainer(Base, metaclass=Meta):\n"
        "    @property\n    def lr(self):\n        return self._lr\n\n"
        "    async def run(self):\n        async for batch in self.stream:\n            await self.step(batch)\n"
    ),
    "tabs": "def train(loader):\n\tfor x in loader:\n\t\tif x:\n\t\t\tloss = model(x)\t# tab before the comment\n\t\tloss.backward()\n",
    "unicode": (
        "# -*- coding: utf-8 -*-\nlégende = 'données ✓'\nfor époque in range(3):\n"
        "    print(f'{légende} — {époque:>3} 🚀', end='…')\n    λ = torch.tensor([1.0])  # 数字\n"
    ),
    "CRLF": "import torch\r\n\r\nfor x in loader:\r\n    loss = model(\r\n        x)\r\n    loss.backward()\r\n",
    "CR only": "x = 1\rfor i in range(3):\r    y = i\r",
    "no trailing newline": "for x in loader:\n    opt.step()",
    "strings and comments": (
        '"""Module docstring\nover lines."""\n\n# a comment\ns = """one\ntwo\r\nthree"""\n'
        "t = ('a'\n     'b' f'{x!r:>{w}}')\nfor x in y:  # trailing\n    pass\n    # footer comment\n"
    ),
    "compound statements": (
        "try:\n    a()\nexcept (ValueError, KeyError) as e:\n    b()\nelse:\n    c()\nfinally:\n    d()\n"
        "while n < 3:\n    n += 1\nelse:\n    pass\n"
        "with torch.autocast('cuda'), open(p) as f:\n    f.read()\n"
        "if a:\n    pass\nelif b:\n    pass\nelse:\n    pass\n"
        "match cmd:\n    case [x, *rest] if x:\n        pass\n    case _:\n        pass\n"
        "lambda_ = lambda q, *r, **s: (q, r, s)\nsquares = [i * i for i in range(9) if i]\n"
        "del a[0], b.c\nglobal g\nassert x, 'msg'\nraise SystemExit(1) from None\n"
    ),
    "empty": "",
    "only comments": "# nothing\n\n# here\n",
    "form feed and backslashes": "x = 1\n\x0c\ny = \\\n    2\nif x and \\\n   y:\n    pass\n",
}


def _assert_same_as_libcst(source: str) -> int:
    module = cst.parse_module(source)
    provider = PositionProvider()
    provider._gen_impl(module)  # the provider's own pass; MetadataWrapper.resolve adds a visit that only copies its table
    expected = provider._computed
    positions = Positions(module)
    for node, code_range in expected.items():
        assert positions[node] == code_range, (type(node).__name__, module.code_for_node(node))
    return len(expected)


@pytest.mark.parametrize("name", SOURCES)
def test_every_node_is_where_libcst_puts_it(name):
    assert _assert_same_as_libcst(SOURCES[name]) > 0


@pytest.mark.parametrize(
    "folder",
    [
        "check",
        pytest.param("planted", marks=pytest.mark.slow),
        pytest.param("rewrite", marks=pytest.mark.slow),
        pytest.param("traps", marks=pytest.mark.slow),
    ],
)
def test_the_fixtures(folder):
    paths = sorted((ROOT / "fixtures" / folder).rglob("*.py"))
    assert len(paths) > 10
    for path in paths:
        _assert_same_as_libcst(path.read_text(encoding="utf-8"))


def test_the_bench_script():
    _assert_same_as_libcst((ROOT / "bench" / "data" / "train_classifier.py").read_text(encoding="utf-8"))


def test_a_notebook_read_as_one_module():
    source, cell_starts = load_module(str(ROOT / "fixtures" / "notebooks" / "train_classifier.ipynb"))
    assert cell_starts
    _assert_same_as_libcst(source)


def test_a_node_of_another_tree_is_a_key_error():
    positions = Positions(cst.parse_module("x = 1\n"))
    with pytest.raises(KeyError):
        positions[cst.parse_module("x = 1\n").body[0]]
