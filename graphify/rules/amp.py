"""amp-grad-scaler: mixed precision pieces that sync or cache."""

import libcst as cst

from graphify.analysis.checker import code_of, kwarg
from graphify.analysis.calls import is_delegated_step, method_call
from graphify.analysis.names import dotted
from graphify.analysis.vocabulary import SCALER
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.registry import rule

SCALER_STEP = rule(
    "GFY421",
    "grad-scaler-step",
    "amp-grad-scaler",
    "error",
    "`GradScaler.step` reads `found_inf` on the host; `update` must run where `step` runs",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)
AUTOCAST_CACHE = rule(
    "GFY422",
    "autocast-cache",
    "amp-grad-scaler",
    "warning",
    "`autocast` inside a captured step needs `cache_enabled=False`",
    True,
    Fix(FixKind.IN_PLACE, Applicability.SAFE),
)

SCALER_HELPER = rule(
    "GFY423",
    "loss-scaler-helper",
    "amp-grad-scaler",
    "error",
    "a loss-scaler object called with the loss and the optimizer runs backward and `GradScaler.step` out of sight",
    False,
)

RULES = (SCALER_STEP, AUTOCAST_CACHE, SCALER_HELPER)


def _autocast_call(expr, env, depth=0):
    if depth > 4:
        return None
    if isinstance(expr, cst.Call):
        return expr if (env.qualify(expr.func) or "").endswith("autocast") else None
    if isinstance(expr, cst.IfExp):
        return _autocast_call(expr.body, env, depth + 1) or _autocast_call(expr.orelse, env, depth + 1)
    name = dotted(expr)
    for value in env.values_of(name) if name else ():
        found = _autocast_call(value, env, depth + 1)
        if found is not None:
            return found
    return None


def check(ck):
    for node, site in ck.nodes():
        env = site.env
        m = method_call(node)
        if m is not None and m[1] in ("step", "update", "unscale_") and env.kind_of(m[0]) == SCALER:
            what = "records the optimizer as unscaled in the scaler's host state" if m[1] == "unscale_" else "reads `found_inf` on the host"
            yield ck.finding(
                SCALER_STEP,
                node,
                site,
                f"`{code_of(node)}` {what}",
                "capture forward and scaled backward; run `scaler.step`/`scaler.update` eagerly after the replay",
            )
        elif isinstance(node, cst.Call) and is_delegated_step(node, env) and env.kind_of(node.func) == SCALER:
            yield ck.finding(
                SCALER_HELPER,
                node,
                site,
                f"`{code_of(node.func)}(...)` runs backward, `GradScaler.step` and `update` inside itself",
                "call `scaler.scale(loss).backward()`, `scaler.step(optimizer)` and `scaler.update()` in the loop",
            )
        elif isinstance(node, cst.WithItem):
            call = _autocast_call(node.item, env)
            if call is not None:
                cache = kwarg(call, "cache_enabled")
                if not (isinstance(cache, cst.Name) and cache.value == "False"):
                    yield ck.finding(
                        AUTOCAST_CACHE,
                        node,
                        site,
                        f"`{code_of(node.item)}` caches casts across the captured region",
                        "pass `cache_enabled=False` to autocast inside a captured step",
                    )
