"""What the cross-device rules share: host factories, and modules the step offloads and brings back."""

import libcst as cst

from graphify.analysis.checker import is_cpu_arg, is_device_arg, is_host_move, kwarg
from graphify.analysis.calls import method_call
from graphify.analysis.devices import is_device_copy
from graphify.analysis.names import dotted
from graphify.analysis.scope import collect_scope
from graphify.analysis.vocabulary import DDP, MODEL

_HOST_FACTORIES = {
    "zeros",
    "ones",
    "full",
    "empty",
    "arange",
    "linspace",
    "randn",
    "rand",
    "randint",
    "randperm",
    "eye",
    "zeros_like",
    "ones_like",
}


def host_factory(expr, env, step_values, depth=0):
    """A tensor created inside the step by a factory called without `device=` (so on the host)."""
    if depth > 3:
        return False
    if isinstance(expr, cst.Call):
        qual = env.qualify(expr.func) or ""
        return qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in _HOST_FACTORIES and kwarg(expr, "device") is None
    name = dotted(expr)
    return bool(name) and any(host_factory(v, env, step_values, depth + 1) for v in step_values.get(name, []))


def module_brought_back(call, env, offloaded: set[str]) -> bool:
    """`ema.to(device="cuda")` of a module that the step also moves to the host (`ema.to("cpu")`): its
    weights cross twice every step. A module's `.to(device)` alone is a no-op once it is there."""
    m = method_call(call)
    if m is None or m[1] not in ("to", "cuda") or dotted(m[0]) not in offloaded or env.kind_of(m[0]) not in (MODEL, DDP):
        return False
    device = kwarg(call, "device") or (call.args[0].value if m[1] == "to" and call.args else None)
    return m[1] == "cuda" or (device is not None and is_device_arg(device, env) and not is_cpu_arg(device, env))


def step_values(ck) -> dict:
    """What the loop body binds each name to."""
    return collect_scope(ck.loop.node.body).values


def offloaded(ck) -> set[str]:
    """Modules the step moves to the host."""
    return {dotted(call.func.value) for call, site in ck.calls() if is_host_move(call, site.env)} - {None}


def device_copies(ck):
    """`(call, site, from_host_factory)` for each copy of per-step data to the device, in the step's order
    (modules brought back from the host are not: module_brought_back)."""
    values_in_body, modules = step_values(ck), offloaded(ck)
    for call, site in ck.calls():
        env = site.env
        if module_brought_back(call, env, modules) or not is_device_copy(call, env, site.ancestors):
            continue
        values = values_in_body if site.block is ck.region.body_block else site.block.env.scope.values
        yield call, site, host_factory(call.func.value, env, values)
