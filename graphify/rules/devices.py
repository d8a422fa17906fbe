"""cross-device: host-to-device copies of per-step data."""

import libcst as cst

from graphify.analysis.checker import code_of, is_cpu_arg, is_device_arg, is_host_move, kwarg
from graphify.analysis.devices import device_for_factory, is_device_copy
from graphify.analysis.calls import iter_nodes, method_call
from graphify.analysis.names import dotted
from graphify.analysis.scope import collect_scope
from graphify.analysis.vocabulary import DDP, LOSS, MODEL
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.registry import rule

STEP_INPUT_COPY = rule(
    "GFY301",
    "per-step-device-copy",
    "cross-device",
    "error",
    "`.to(device)`/`.cuda()` of per-step data reads a host address that replay never refreshes",
    True,
    Fix(FixKind.STATIC_INPUT, Applicability.SAFE),
)
HOST_TENSOR_COPY = rule(
    "GFY302",
    "host-tensor-moved-in-step",
    "cross-device",
    "error",
    "a tensor created on the host inside the step is copied to the device",
    True,
    Fix(FixKind.ON_DEVICE, Applicability.SAFE),
)

HOST_ARRAY_INDEX = rule(
    "GFY303",
    "host-array-index",
    "cross-device",
    "error",
    "a tensor indexed with a numpy array or a list of numbers: the index is copied to the device every step",
    False,
)

RULES = (STEP_INPUT_COPY, HOST_TENSOR_COPY, HOST_ARRAY_INDEX)


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


def _host_factory(expr, env, step_values, depth=0):
    """A tensor created inside the step by a factory called without `device=` (so on the host)."""
    if depth > 3:
        return False
    if isinstance(expr, cst.Call):
        qual = env.qualify(expr.func) or ""
        return qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in _HOST_FACTORIES and kwarg(expr, "device") is None
    name = dotted(expr)
    return bool(name) and any(_host_factory(v, env, step_values, depth + 1) for v in step_values.get(name, []))


def _module_brought_back(call, env, offloaded: set[str]) -> bool:
    """`ema.to(device="cuda")` of a module that the step also moves to the host (`ema.to("cpu")`): its
    weights cross twice every step. A module's `.to(device)` alone is a no-op once it is there."""
    m = method_call(call)
    if m is None or m[1] not in ("to", "cuda") or dotted(m[0]) not in offloaded or env.kind_of(m[0]) not in (MODEL, DDP):
        return False
    device = kwarg(call, "device") or (call.args[0].value if m[1] == "to" and call.args else None)
    return m[1] == "cuda" or (device is not None and is_device_arg(device, env) and not is_cpu_arg(device, env))


def _host_array(expr, env, depth=0) -> bool:
    """A numpy array or a Python list of host numbers: made by a `numpy` call, a list literal or
    comprehension of host values, a slice of one, or a name bound only to those (or to None, tested apart)."""
    if depth > 3:
        return False
    if isinstance(expr, cst.Call):
        qual = env.qualify(expr.func) or ""
        return qual.startswith("numpy.") and not qual.startswith("numpy.random.seed")
    if isinstance(expr, cst.List):
        return bool(expr.elements) and all(env.is_host(e.value) for e in expr.elements)
    if isinstance(expr, cst.ListComp):
        return env.is_host(expr.elt)
    if isinstance(expr, cst.Subscript):
        return _host_array(expr.value, env, depth + 1)
    if isinstance(expr, cst.IfExp):
        return _all_host_arrays([expr.body, expr.orelse], env, depth)
    name = dotted(expr) if isinstance(expr, cst.Name) else None
    return _all_host_arrays(env.values_of(name), env, depth) if name else False


def _all_host_arrays(values, env, depth) -> bool:
    values = [v for v in values if not (isinstance(v, cst.Name) and v.value == "None")]
    return bool(values) and all(_host_array(v, env, depth + 1) for v in values)


def _host_array_index(node, env) -> bool:
    """`tensor[indices]` (or `tensor[:, indices]`) with host indices: torch turns them into a host index
    tensor and copies it."""
    return any(isinstance(el.slice, cst.Index) and _host_array(el.slice.value, env) for el in node.slice) and env.is_tensor(node.value)


def check(ck):
    for node, site in ck.nodes():
        if isinstance(node, cst.Subscript) and _host_array_index(node, site.env):
            yield ck.finding(
                HOST_ARRAY_INDEX,
                node,
                site,
                f"`{code_of(node)}` indexes a tensor with host indices, copied to the device every step",
                "make the indices a device tensor (`torch.randperm(n, device=device)`, or copy them into a static device buffer)",
            )
    step_values = collect_scope(ck.loop.node.body).values
    yield from _batches_handed_to_device_helpers(ck, step_values)
    offloaded = {dotted(call.func.value) for call, site in ck.calls() if is_host_move(call, site.env)} - {None}
    for call, site in ck.calls():
        env = site.env
        if _module_brought_back(call, env, offloaded):
            yield ck.finding(
                STEP_INPUT_COPY,
                call,
                site,
                f"`{code_of(call)}` copies a module the step offloads back to the device every step",
                "keep the module on the device during training; offload it between epochs, if at all",
                False,
            )
            continue
        if not is_device_copy(call, env, site.ancestors):
            continue
        receiver = call.func.value
        values = step_values if site.block is ck.region.body_block else site.block.env.scope.values
        if _host_factory(receiver, env, values):
            in_file = site.block.module is ck.loop.module  # the rewrite edits the loop's own file only
            yield ck.finding(
                HOST_TENSOR_COPY,
                call,
                site,
                f"`{code_of(call)}` creates a tensor on the host and copies it every step",
                "create it directly on the device (`device=`), or once before the loop",
                removable=in_file and device_for_factory(call, env) is not None,
            )
        else:
            yield ck.finding(
                STEP_INPUT_COPY,
                call,
                site,
                f"`{code_of(call)}` copies per-step data to the device",
                "copy each batch into a static device buffer with `static.copy_(batch, non_blocking=True)` before the replay",
            )


def _per_step_batches(ck, step_values) -> set[str]:
    """Names that hold the batch of this iteration: the loop's target, or what `next(iterator)` returns."""
    names = set()
    if isinstance(ck.loop.node, cst.For):
        names.update(n.value for n in iter_nodes(ck.loop.node.target) if isinstance(n, cst.Name))
    for name, values in step_values.items():
        if any(isinstance(v, cst.Call) and isinstance(v.func, cst.Name) and v.func.value == "next" for v in values):
            names.add(name)
    return names


def _batches_handed_to_device_helpers(ck, step_values):
    """`batch = task.prepare_batch(batch, device)`, `batch_to_device(batch, self._device)`: a helper whose body
    graphify does not see is handed the step's batch and a device; it copies the batch there. The rewrite
    cannot turn that into a static-buffer copy, so the statement stays eager, before the step."""
    batches = _per_step_batches(ck, step_values)
    followed = {id(b.call) for b in ck.region.blocks if b.call is not None}
    for call, site in ck.calls():
        if site.block is not ck.region.body_block or id(call) in followed or not batches:
            continue
        env = site.env
        args = [a.value for a in call.args if not a.star]
        m = method_call(call)
        if (
            (m is not None and m[1] in ("to", "cuda", "type"))
            or not any(isinstance(a, cst.Name) and a.value in batches for a in args)
            or not any(is_device_arg(a, env) and not is_cpu_arg(a, env) for a in args)
            or (env.qualify(call.func) or "").startswith("torch.")
            or env.kind_of(call.func) in (MODEL, DDP, LOSS)
        ):
            continue
        yield ck.finding(
            STEP_INPUT_COPY,
            call,
            site,
            f"`{code_of(call)}` is handed the step's batch and a device: it copies per-step data to the device",
            "copy each batch to the device before the step, or into static device buffers",
            False,
        )
