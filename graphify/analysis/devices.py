"""Device copies: which calls copy a tensor to the device (`x.to(device)`, `x.cuda()`, `x.type(torch.cuda.FloatTensor)`),
legacy tensor types (`torch.cuda.LongTensor`), and the `device=` that builds a host factory's tensor on the device
instead of copying it there."""

import libcst as cst

from graphify.analysis.calls import method_call
from graphify.analysis.checker import is_cpu_arg, is_device_arg, is_on_device, kwarg
from graphify.analysis.names import code_text, dotted
from graphify.analysis.vocabulary import DDP, LOSS, MODEL

# Factories whose tensor is the same made on the host or on the device (random ones draw from another generator).
_SAME_ON_DEVICE = {"zeros", "ones", "full", "empty", "eye"}


def device_for_factory(call: cst.Call, env) -> str | None:
    """For `torch.zeros(...).to(device)` or `.cuda()`, written in the file being rewritten: the `device=`
    that makes the factory build the same tensor on the device (`device`, `"cuda"`). None when that would
    not be the same (a random factory, a name bound to a factory, `.to` with a dtype or other arguments)."""
    m = method_call(call)
    if m is None or not isinstance(m[0], cst.Call):
        return None
    factory, method = m
    qual = env.qualify(factory.func) or ""
    if not qual.startswith("torch.") or qual.rsplit(".", 1)[-1] not in _SAME_ON_DEVICE or kwarg(factory, "device") is not None:
        return None
    extra = [a for a in call.args if not (a.keyword is not None and a.keyword.value == "non_blocking")]
    if method == "cuda":
        return '"cuda"' if not extra else None
    if method != "to" or len(extra) != 1 or (extra[0].keyword is not None and extra[0].keyword.value != "device"):
        return None
    device = extra[0].value
    if not is_device_arg(device, env) or is_cpu_arg(device, env):
        return None
    return code_text(device)


def legacy_tensor_type(expr, env, cuda: bool = False, depth: int = 0) -> bool:
    """`torch.FloatTensor`, `torch.cuda.LongTensor`, or a name bound to one (through `a if c else b`)."""
    if depth > 3:
        return False
    if isinstance(expr, cst.IfExp):
        return legacy_tensor_type(expr.body, env, cuda, depth + 1) or legacy_tensor_type(expr.orelse, env, cuda, depth + 1)
    qual = env.qualify(expr) or ""
    if qual.startswith("torch.") and qual.endswith("Tensor") and (not cuda or qual.startswith("torch.cuda.")):
        return True
    name = dotted(expr)
    return bool(name) and any(legacy_tensor_type(v, env, cuda, depth + 1) for v in env.values_of(name))


def is_device_copy(call, env, ancestors: tuple[cst.CSTNode, ...] | None = None) -> bool:
    """`x.to(device)`, `x.cuda()`, ... of a tensor not already there; `ancestors`: where the call stands
    (a Site's), so that an earlier move of `x` in the same iteration is seen."""
    m = method_call(call)
    if m is None:
        return False
    receiver, name = m
    if name == "cuda":
        pass
    elif name == "type":  # imgs.type(Tensor), Tensor = torch.cuda.FloatTensor if cuda else ...
        if not (call.args and legacy_tensor_type(call.args[0].value, env, cuda=True)):
            return False
    elif name == "to":
        device = kwarg(call, "device")
        first = call.args[0].value if call.args and call.args[0].keyword is None else None
        if device is None and first is not None and is_device_arg(first, env) and not is_cpu_arg(first, env):
            device = first
        if device is None or is_cpu_arg(device, env):
            return False
    else:
        return False
    # a tensor made or moved there already copies nothing: a true finding, but no breaker
    where = (call, ancestors) if ancestors is not None else None
    return env.kind_of(receiver) not in (MODEL, DDP, LOSS) and not env.is_host(receiver) and not is_on_device(receiver, env, where=where)
