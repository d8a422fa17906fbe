"""What the analysis's fast paths assume of libcst's classes: exact type tests (`type(n) is cst.Call`)
in place of isinstance, and the MRO in place of issubclass on its abstract classes."""

import inspect

import libcst as cst

from graphify.analysis.tree import _TOKENS, _wanted

NODE_CLASSES = [c for c in vars(cst).values() if inspect.isclass(c) and issubclass(c, cst.CSTNode)]


def test_no_concrete_node_class_has_a_subclass():
    concrete = [c for c in NODE_CLASSES if not inspect.isabstract(c)]
    assert len(concrete) > 100
    assert [c.__name__ for c in concrete if c.__subclasses__()] == []


def test_the_mro_answers_as_issubclass_does():
    for cls in [*NODE_CLASSES, str, type(None), cst.MaybeSentinel]:
        assert _wanted(cls) == (issubclass(cls, cst.CSTNode) and not issubclass(cls, _TOKENS)), cls
