"""dynamic-shape: per-step input shapes that differ from the captured ones."""

import libcst as cst

from graphify.analysis.checker import code_of, is_true, kwarg
from graphify.analysis.names import dotted
from graphify.rules.registry import rule

NO_DROP_LAST = rule(
    "GFY251",
    "loader-without-drop-last",
    "dynamic-shape",
    "warning",
    "a DataLoader without `drop_last=True` yields a smaller last batch",
    True,
)
VARIABLE_LENGTH = rule(
    "GFY252",
    "variable-length-batch",
    "dynamic-shape",
    "error",
    "per-batch padding, packing or slicing to a per-step length changes shapes every step",
    False,
)

RULES = (NO_DROP_LAST, VARIABLE_LENGTH)


_PADDING = {"pad_sequence", "pack_padded_sequence", "pack_sequence", "pad_packed_sequence"}


def _dataloader(expr, env, depth=0):
    """The DataLoader(...) call an iterable comes from, with the module it is in."""
    if depth > 6 or expr is None:
        return None
    if isinstance(expr, cst.Call):
        last = (env.qualify(expr.func) or "").rsplit(".", 1)[-1]
        if last == "DataLoader":
            return expr, env.module
        if last in ("iter", "enumerate", "tqdm", "cycle", "islice") and expr.args:
            return _dataloader(expr.args[0].value, env, depth + 1)
        return None
    name = dotted(expr)
    if name is None:
        return None
    if name in env.bound:
        caller, arg = env.bound[name]
        return _dataloader(arg, caller, depth + 1)
    for value in reversed(env.values_of(name)):
        found = _dataloader(value, env, depth + 1)
        if found is not None:
            return found
    return None


def check(ck):
    seen = set()
    for iterable, env in ck.loop_iterables():
        found = _dataloader(iterable, env)
        if found is None or id(found[0]) in seen:
            continue
        call, module = found
        seen.add(id(call))
        if not is_true(kwarg(call, "drop_last")) and kwarg(call, "batch_sampler") is None:
            yield ck.finding_at(
                NO_DROP_LAST,
                call,
                module,
                f"`{code_of(call, 50)}` has no `drop_last=True`: the last batch can be smaller",
                "pass `drop_last=True`, or let graphify run the partial last batch eagerly behind a shape guard",
            )
    for call, site in ck.calls():
        last = (site.env.qualify(call.func) or "").rsplit(".", 1)[-1]
        if last in _PADDING:
            yield ck.finding(
                VARIABLE_LENGTH,
                call,
                site,
                f"`{code_of(call)}` gives every batch its own shape",
                "pad to a fixed maximum length (or a few bucket lengths, one graph each)",
            )
