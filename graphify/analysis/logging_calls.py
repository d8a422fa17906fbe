"""Which calls log, print or report progress: host I/O a captured step must not hold."""

from __future__ import annotations

import libcst as cst

from graphify.analysis.calls import iter_nodes, method_call
from graphify.analysis.names import dotted
from graphify.analysis.values import Env

LOGGING_METHODS = {
    "debug",
    "info",
    "warning",
    "warn",
    "error",
    "critical",
    "exception",
    "log",
    "add_scalar",
    "add_scalars",
    "add_histogram",
    "add_image",
    "add_text",
    "log_metrics",
    "log_metric",
    "set_postfix",
    "set_postfix_str",
    "set_description",
    "set_description_str",
    "write",
}
METER_METHODS = {"update", "log_dict", "add"}
METER_NAME_HINTS = ("meter", "metric_logger", "logger", "tracker", "stats")
LOGGER_NAME_HINTS = (
    "log",
    "writer",
    "wandb",
    "mlflow",
    "tb",
    "summary",
    "pbar",
    "bar",
    "progress",
    "tqdm",
    "run",
    "experiment",
    "accelerator",
    "console",
    "self",
)


def is_logging_call(call: cst.Call, env: Env) -> bool:
    func = call.func
    if isinstance(func, cst.Name):
        return func.value == "print" or func.value.startswith(("progress_bar", "log_"))
    qual = env.qualify(func) or ""
    if qual.startswith(("logging.", "wandb.", "mlflow.", "tqdm.write", "tqdm.tqdm.write", "sys.stdout.write", "sys.stderr.write")):
        return True
    m = method_call(call)
    if m is None:
        return False
    receiver, name = m
    while isinstance(receiver, cst.Subscript):  # metric_logger.meters['acc1'].update(...)
        receiver = receiver.value
    if name == "print":
        return True
    recv = (dotted(receiver) or "").lower()
    local = env._local_method(call.func)
    if local is not None and name in METER_METHODS:
        # a meter of a local class: what its body does decides. Sums kept on the host are bookkeeping, as a
        # list's append is, not I/O; fed tensors, it does device math the analysis follows into its body.
        return _prints_or_logs(local)
    if name in METER_METHODS and any(h in part for part in recv.split(".") for h in METER_NAME_HINTS):
        return True  # metric_logger.update(loss=loss_value): a library's logger, read on the host to log
    if name not in LOGGING_METHODS:
        return False
    if name == "log" and recv == "self":
        return True  # LightningModule.log
    if name in ("write",) and not any(h in recv for h in ("pbar", "bar", "tqdm", "stdout", "stderr")):
        return False
    return any(h in recv.rsplit(".", 1)[-1] or h in recv for h in LOGGER_NAME_HINTS) or _built_as_logger(receiver, env)


def _prints_or_logs(fn: cst.FunctionDef) -> bool:
    """Whether a method prints, logs or writes (directly): `print(...)`, `logger.info(...)`, `f.write(...)`."""
    for n in iter_nodes(fn.body):
        if type(n) is not cst.Call:
            continue
        if isinstance(n.func, cst.Name) and n.func.value == "print":
            return True
        if isinstance(n.func, cst.Attribute) and n.func.attr.value in LOGGING_METHODS:
            return True
    return False


# what the function building a receiver is named after: `wb = get_wandb_backend(args)`, `tracker = make_logger(cfg)`
_LOGGER_FACTORY_HINTS = ("wandb", "mlflow", "trackio", "logger", "writer", "tensorboard")


def _built_as_logger(receiver: cst.BaseExpression, env: Env) -> bool:
    name = dotted(receiver)
    built = [v for v in env.values_of(name) if type(v) is cst.Call] if name else []
    return any(h in (env.qualify(v.func) or "").rsplit(".", 1)[-1].lower() for v in built for h in _LOGGER_FACTORY_HINTS)
