"""What containers of values hold: the elements of an iterable, the element of a comprehension.

Functions of an `Env` (analysis/values.py), which calls them for `sum(...)`, `max(...)` and dict
comprehensions; a verdict is True (tensors), False (host values) or None (unknown).
"""

from __future__ import annotations

import libcst as cst

from graphify.analysis.names import dotted
from graphify.analysis.scope import target_names

# exact types (analysis/tree.py says why)
_COMPREHENSIONS = frozenset((cst.GeneratorExp, cst.ListComp, cst.SetComp))


def _dict_view(expr: cst.BaseExpression, *methods: str) -> cst.BaseExpression | None:
    """`d` of `d.items()` / `d.values()`."""
    if type(expr) is cst.Call and type(expr.func) is cst.Attribute and expr.func.attr.value in methods:
        return expr.func.value
    return None


def elements_tensor(env, iterable: cst.BaseExpression, depth: int) -> bool | None:
    """Whether what an iterable yields holds tensors: `sum(d.values())` sums the dict's values."""
    if type(iterable) in _COMPREHENSIONS:
        return comprehension_tensor(env, iterable, iterable.elt, depth)
    if type(iterable) in (cst.List, cst.Tuple, cst.Set):
        return env._any_tensor([e.value for e in iterable.elements], depth)
    mapping = _dict_view(iterable, "values")
    return env._tensor(mapping if mapping is not None else iterable, depth + 1)


def comprehension_tensor(env, comp, element: cst.BaseExpression, depth: int) -> bool | None:
    """The comprehension's `element`, its `for k, v in d.items()` / `for v in d.values()` targets read as
    the dict's values (the keys as host values), its other targets unknown."""
    bound: dict[str, bool | None] = {}
    clause = comp.for_in
    while clause is not None:
        target, mapping = clause.target, _dict_view(clause.iter, "items", "values")
        if mapping is not None and clause.iter.func.attr.value == "items" and type(target) is cst.Tuple and len(target.elements) == 2:
            bound.update((name, False) for name in target_names(target.elements[0].value))
            target = target.elements[1].value
        if mapping is not None and type(target) is cst.Name:
            bound[target.value] = env._tensor(mapping, depth + 1)
        for name in target_names(target):
            bound.setdefault(name, None)
        clause = clause.inner_for_in
    saved = {name: (name in env.tensors, name in env.hosts) for name in bound}
    try:
        _assign(env, bound)
        return env._tensor(element, depth + 1)
    finally:
        _assign(env, {name: True if was_tensor else False if was_host else None for name, (was_tensor, was_host) in saved.items()})


def _assign(env, verdicts: dict[str, bool | None]) -> None:
    for name, verdict in verdicts.items():
        env.tensors.discard(name)
        env.hosts.discard(name)
        if verdict is not None:
            (env.tensors if verdict else env.hosts).add(name)


_CONTAINER_MAKERS = frozenset(("list", "dict", "set", "deque", "defaultdict", "OrderedDict", "Counter"))


def makes_container(value: cst.BaseExpression) -> bool:
    """A list, dict, set or deque made here: a literal, a comprehension or a constructor call (`deque()`,
    `collections.defaultdict(list)`)."""
    if isinstance(value, (cst.List, cst.Dict, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp)):
        return True
    return isinstance(value, cst.Call) and (dotted(value.func) or "").rsplit(".", 1)[-1] in _CONTAINER_MAKERS
