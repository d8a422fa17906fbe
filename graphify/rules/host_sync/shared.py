"""What the host-sync rules share: which branch of the host reads a call makes, and the step's host tensors.

A call is one host read at most: `method_read` and `call_read` tell which (the first that fits, in the
order below), so that two rules never report the same read.
"""

import libcst as cst

from graphify.analysis.calls import method_call
from graphify.analysis.checker import code_of, is_host_move, is_true, kwarg
from graphify.analysis.logging_calls import is_logging_call
from graphify.analysis.vocabulary import DDP, LOSS, MODEL
from graphify.rules.host_sync.host_tensors import host_batch_names, on_host

DYNAMIC = {"nonzero", "unique", "unique_consecutive", "argwhere", "masked_select"}
READ_AFTER = "read it after the step (graphify rewrite reads the graph's static output after each replay)"


def method_read(ck, call: cst.Call, site, host_batch: set[str]) -> str | None:
    """What a method call on a tensor (or module) reads on the host: "item", "tolist", "module_to_cpu",
    "to_cpu", "numpy", "synchronize", "dynamic"; None for a batch item the step never moved to the device
    (reading it waits for nothing) and for any other call."""
    m = method_call(call)
    if m is None:
        return None
    receiver, name = m
    env = site.env
    kind = env.kind_of(receiver)
    if site.block is ck.region.body_block and on_host(receiver, host_batch):
        return None
    if name == "item" and not call.args and not env.is_host(receiver) and kind is None:
        return "item"
    if name == "tolist" and env.is_tensor(receiver):
        return "tolist"
    if is_host_move(call, env) and kind in (MODEL, DDP):
        return "module_to_cpu"
    if is_host_move(call, env) and kind != LOSS and not env.is_host(receiver):
        return "to_cpu"
    if name == "numpy" and not env.is_host(receiver) and kind is None:
        return "numpy"
    if name == "synchronize" and not (env.qualify(call.func) or "").startswith("torch.distributed"):
        return "synchronize"
    if name in DYNAMIC and env.is_tensor(receiver):
        return "dynamic"
    return None


def call_read(call: cst.Call, env) -> str | None:
    """What a function call reads on the host: "dynamic", "clip", "empty_cache", "scalar", "log" (a
    logging call, `str`, `repr`: reads tensors handed to it), "format"; None for any other."""
    qual = env.qualify(call.func) or ""
    last = qual.rsplit(".", 1)[-1]
    if qual.startswith("torch.") and (last in DYNAMIC or (last == "where" and len(call.args) == 1)):
        return "dynamic"
    if last in ("clip_grad_norm_", "clip_grad_norm") and is_true(kwarg(call, "error_if_nonfinite")):
        return "clip"
    if qual == "torch.cuda.empty_cache":
        return "empty_cache"
    if (
        isinstance(call.func, cst.Name)
        and call.func.value in ("float", "int", "bool", "complex")
        and call.args
        and env.is_tensor(call.args[0].value)
    ):
        return "scalar"
    if is_logging_call(call, env) or (isinstance(call.func, cst.Name) and call.func.value in ("str", "repr")):
        return "log"
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "format" and any(env.is_tensor(a.value) for a in call.args):
        return "format"
    return None


def method_read_findings(ck, rule, read: str, says: str):
    """`rule`'s findings: every `x.<read>()` of the step that `method_read` tells is that host read,
    removable where the read can move after the replay."""
    host_batch = host_batch_names(ck)
    for call, site in ck.calls():
        if method_read(ck, call, site, host_batch) == read:
            yield ck.finding(
                rule, call, site, f"`{code_of(method_call(call)[0])}.{read}()` {says}", READ_AFTER, ck.host_read_removable(call, site)
            )
