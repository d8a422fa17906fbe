"""Tensors that stay on the host in the step: items of a torch `DataLoader` the step never moves to the device.

A `DataLoader` yields CPU tensors (pinned or not). An item the loop body only ever rebinds to a slice of
itself (`allcaps = allcaps[sort_ind]`) stays there: reading it (`.tolist()`) waits for nothing, and
indexing it with a device tensor copies the index to the host.
"""

from __future__ import annotations

import libcst as cst

from graphify.analysis.calls import is_model_call
from graphify.analysis.names import dotted
from graphify.analysis.scope import target_names
from graphify.analysis.targets import unwrap_iterable


def host_batch_names(ck) -> set[str]:
    loop = ck.loop.node
    if type(loop) is not cst.For:
        return set()
    env = ck.body_env
    it, target = unwrap_iterable(loop.iter, env), loop.target
    if type(it) is cst.Call and (env.qualify(it.func) or "") == "enumerate" and it.args and type(target) is cst.Tuple:
        it, target = unwrap_iterable(it.args[0].value, env), target.elements[-1].value
    built = ck.construction(it, env)
    if built is None or built[1].aliases.qualify(built[0].func) != "torch.utils.data.DataLoader":
        return set()
    rebound = ck.loop_scope.values
    return {
        name for name in target_names(target) if all(type(v) is cst.Subscript and dotted(v.value) == name for v in rebound.get(name, ()))
    }


def on_host(expr: cst.BaseExpression, names: set[str]) -> bool:
    """`allcaps`, `allcaps[j]`: a host batch item or a slice of one."""
    while type(expr) is cst.Subscript:
        expr = expr.value
    return type(expr) is cst.Name and expr.value in names


def model_output(expr: cst.BaseExpression, ck, env) -> bool:
    """A name the loop body binds only to (a part of) a model's output: a device tensor."""
    values = ck.loop_scope.values.get(expr.value, ()) if type(expr) is cst.Name else ()
    parts = [v.value if type(v) is cst.Subscript else v for v in values]
    return bool(parts) and all(type(p) is cst.Call and is_model_call(p, env) for p in parts)
