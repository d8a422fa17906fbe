"""What the amp-grad-scaler rules share."""

from graphify.analysis.calls import method_call
from graphify.analysis.vocabulary import SCALER


def scaler_method(node, env) -> str | None:
    """`scaler.step(...)`, `scaler.update()`, `scaler.unscale_(...)` of a GradScaler: the method's name."""
    m = method_call(node)
    return m[1] if m is not None and m[1] in ("step", "update", "unscale_") and env.kind_of(m[0]) == SCALER else None
