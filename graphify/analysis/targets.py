"""What a `for` loop's target holds: items of a loader, an index, a batch dict."""

from __future__ import annotations


import libcst as cst

from graphify.analysis.names import dotted
from graphify.analysis.tree import descendants
from graphify.analysis.values import Env
from graphify.analysis.vocabulary import LOADER, SAME_ITEMS


def unwrap_iterable(expr: cst.BaseExpression, env: Env) -> cst.BaseExpression:
    """`tqdm(loader, ...)`, `iter(loader)`, `islice(loader, n)` -> `loader`."""
    while isinstance(expr, cst.Call) and expr.args:
        name = (env.qualify(expr.func) or "").rsplit(".", 1)[-1]
        if name in ("tqdm", "iter", "islice", "track", "progress", "prefetch", "reversed", "sorted", "list"):
            expr = expr.args[0].value
        else:
            break
    return expr


def seed_loop_target(target: cst.BaseExpression, it: cst.BaseExpression, env: Env, seeds: dict[str, bool]) -> None:
    it = unwrap_iterable(it, env)
    name = dotted(target)
    if isinstance(it, cst.Call):
        fname = (env.qualify(it.func) or "").rsplit(".", 1)[-1]
        if fname in ("range", "trange", "count"):  # itertools.count(): the step counter of `zip(count(), loader)`
            if name:
                seeds[name] = False
            return
        if fname == "enumerate" and it.args and isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2:
            first = dotted(target.elements[0].value)
            if first:
                seeds[first] = False
            seed_loop_target(target.elements[1].value, it.args[0].value, env, seeds)
            return
        if fname == "zip" and isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == len(it.args):
            for el, arg in zip(target.elements, it.args):
                seed_loop_target(el.value, arg.value, env, seeds)
            return
        if fname in (
            "items",
            "keys",
            "values",
            "named_parameters",
            "named_modules",
            "named_children",
            "modules",
            "children",
            "param_groups",
        ):
            for n in _target_leaves(target):
                seeds.setdefault(n, False)
            return
        if fname in ("parameters", "buffers"):
            for n in _target_leaves(target):
                seeds[n] = True
            return
    if (
        isinstance(it, (cst.List, cst.Tuple, cst.Set))
        or dotted(it) in ("self.param_groups",)
        or (isinstance(it, cst.Attribute) and it.attr.value == "param_groups")
    ):
        for n in _target_leaves(target):
            seeds.setdefault(n, False)
        return
    iterable = dotted(it)
    kind = env.kind_of(it) if iterable else None
    if kind is None and (
        _host_sequence(it, env) or _list_of_records(it, env)
    ):  # `for t, t_next in time_pairs`, pairs of ints from `.tolist()`
        for n in _target_leaves(target):
            seeds.setdefault(n, False)
    elif kind in (LOADER, None) and env._tensor(it, 0) is not False:
        for n in _target_leaves(target):
            seeds[n] = True


def _host_sequence(expr: cst.BaseExpression, env: Env, depth: int = 0) -> bool:
    """A sequence of host values, by what it is built from (the loop's target is typed before the names
    of its function are): `.tolist()` of a tensor, `range(...)`, and lists, zips and slices of those."""
    if depth > 12:
        return False
    if isinstance(expr, cst.Subscript):
        return _host_sequence(expr.value, env, depth + 1)
    if isinstance(expr, cst.Call):
        if isinstance(expr.func, cst.Attribute):
            return expr.func.attr.value == "tolist"
        name = expr.func.value if isinstance(expr.func, cst.Name) else None
        if name == "range":
            return True
        args = [a.value for a in expr.args if a.keyword is None]
        return name in SAME_ITEMS and bool(args) and all(_host_sequence(a, env, depth + 1) for a in args)
    if isinstance(expr, cst.Name):
        values = env.values_of(expr.value)
        return bool(values) and all(_host_sequence(v, env, depth + 1) for v in values)
    return False


def _list_of_records(expr: cst.BaseExpression, env: Env) -> bool:
    """A list the function builds of dicts (`phases = []` then `phases.append(dict(name=..., opt=...))`, or
    `[{"name": "G", ...}, ...]`): each item is a record of objects, not a tensor."""
    if not isinstance(expr, cst.Name):
        return False
    values = env.values_of(expr.value)
    if not values or not all(isinstance(v, (cst.List, cst.Tuple)) for v in values):
        return False
    items = [e.value for v in values for e in v.elements]
    body = getattr(env.func, "node", None) or getattr(env.module, "tree", None)
    for n in descendants(body) if body is not None else ():
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "append":
            if dotted(n.func.value) == expr.value and n.args:
                items.append(n.args[0].value)
    return bool(items) and all(_is_record(item, env) for item in items)


def _is_record(expr: cst.BaseExpression, env: Env) -> bool:
    if isinstance(expr, cst.Dict):
        return True
    return isinstance(expr, cst.Call) and (env.qualify(expr.func) or "") in ("dict", "types.SimpleNamespace", "argparse.Namespace")


def _target_leaves(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for el in target.elements for n in _target_leaves(el.value)]
    name = dotted(target)
    return [name] if name else []
