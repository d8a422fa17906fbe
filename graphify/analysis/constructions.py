"""Every construction an optimizer name may hold, for rules that judge the optimizer's class and flags."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from graphify.analysis.names import dotted
from graphify.analysis.tree import returns
from graphify.analysis.values import Env
from graphify.analysis.vocabulary import KNOWN_OPTIMIZERS

_MAX_DEPTH = 6


def without_device_moves(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`model` of `model.to(device).cuda()`: the object a move returns is the one it was called on."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("to", "cuda"):
        expr = expr.func.value
    return expr


def optimizer_constructions(expr: cst.BaseExpression, env: Env, depth: int = 0) -> Iterator[tuple[str, cst.Call, object]]:
    """(class name, call, ModuleInfo) for each call that may have built `expr`: every assignment of a name
    (`if args.optimizer == "adamw": ... elif ...`), both arms of a conditional expression, the returns of a
    same-file builder function, and a class held in a name (`optimizer_cls = torch.optim.AdamW`)."""
    if depth > _MAX_DEPTH:
        return
    expr = without_device_moves(expr)
    if isinstance(expr, cst.IfExp):
        yield from optimizer_constructions(expr.body, env, depth + 1)
        yield from optimizer_constructions(expr.orelse, env, depth + 1)
        return
    if isinstance(expr, cst.Call):
        yield from _call_constructions(expr, env, depth)
        return
    name = dotted(expr)
    if name in env.bound:
        caller, arg = env.bound[name]
        yield from optimizer_constructions(arg, caller, depth + 1)
    elif name is not None:
        for value in env.values_of(name):
            yield from optimizer_constructions(value, env, depth + 1)


def _call_constructions(call: cst.Call, env: Env, depth: int) -> Iterator[tuple[str, cst.Call, object]]:
    qual = env.qualify(call.func) or ""
    func = call.func.value if isinstance(call.func, cst.Name) else None
    module = env.module
    if func is None or qual.rsplit(".", 1)[-1] in KNOWN_OPTIMIZERS:
        yield qual.rsplit(".", 1)[-1], call, module
        return
    if module is not None and func in module.functions and func not in env.scope.values:
        builder = module.function_info(module.functions[func], None)
        inner = builder.new_env()
        for value in (r.value for r in returns(builder.node)):
            yield from optimizer_constructions(value, inner, depth + 1)
        return
    classes = [env.qualify(v) or "" for v in env.values_of(func)] or [qual]
    for held in classes:
        yield held.rsplit(".", 1)[-1], call, module
