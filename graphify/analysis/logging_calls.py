"""Which calls log, print, report progress or write files: host I/O a captured step must not hold.

A call is told by what it calls: a logging library's function, a method of an object a reporting library
(or a class named as one) built, or, where the analysis cannot read the function's body (it lives in a
module it does not have), the verb the function is named by (`save_image`, `plot_samples`, `log_metrics`).
"""

from __future__ import annotations

import re

import libcst as cst

from graphify.analysis.calls import _defined_here, iter_nodes, method_call
from graphify.analysis.names import dotted
from graphify.analysis.values import Env
from graphify.analysis.vocabulary import PURE_BUILTINS

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
    if isinstance(func, cst.Name) and (func.value == "print" or func.value.startswith("progress_bar")):
        return True
    if isinstance(func, cst.Name) and func.value.startswith("log_") and _unread_function_named(call, env, frozenset({"log"})):
        return True  # log_metrics(...), not log_prob(...)
    qual = env.qualify(func) or ""
    if qual.startswith(("logging.", "wandb.", "mlflow.", "tqdm.write", "tqdm.tqdm.write", "sys.stdout.write", "sys.stderr.write")):
        return True
    if qual in _SHOWING:
        return True  # a figure or image put on screen
    m = method_call(call)
    if m is None:
        return False
    if built_by_reporter(m[0], env):
        return True  # `pbar.update(1)`, `writer.add_audio(...)`, `self.logger.scalar_summary(...)`
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


# Libraries whose objects report: every method of what they build writes progress, logs or draws.
_REPORTING_LIBRARIES = (
    "tqdm",
    "torch.utils.tensorboard",
    "tensorboardX",
    "tensorboard",
    "visdom",
    "wandb",
    "mlflow",
    "neptune",
    "comet_ml",
    "clearml",
    "aim",
    "logging",
    "rich.progress",
    "progress",
    "dllogger",
)
_SHOWING = frozenset({"matplotlib.pyplot.show", "matplotlib.pyplot.pause", "matplotlib.pyplot.draw", "cv2.imshow", "cv2.waitKey"})
# what a class (a reporting library's or the user's own) that reports is called: `Logger(log_dir)`,
# `SummaryWriter()`, `ProgressBar(total)`, `Visualizer(opt)`
_REPORTER_CLASS = re.compile(r"(Writer|Logger|Progress|ProgressBar|Bar|Visualizer|Visualiser|Plotter|Recorder)$")


def built_by_reporter(receiver: cst.BaseExpression, env: Env) -> bool:
    """`pbar = tqdm(loader)`, `self.writer = SummaryWriter(log_dir)`, `logger = logging.getLogger(...)`,
    `viz = Visualizer(opt)`, or a parameter its call site passed one of these."""
    return _built_by(receiver, env, _REPORTING_LIBRARIES, _REPORTER_CLASS)


def is_named_as_reporting(call: cst.Call, env: Env) -> bool:
    """A function the analysis cannot read, named for reporting: `visual(gt, pred, path)`, `log(logger, step,
    losses=losses)`, `utils.summarize(writer, ...)`. Only a call whose result is not used is read so: one
    whose result is (`img = plot_to_numpy(x)`) computes."""
    return _unread_function_named(call, env, _REPORTING_VERBS)


def is_file_write(call: cst.Call, env: Env) -> bool:
    """A call the analysis cannot read that saves (`save_checkpoint(state, path)`, `utils.saveimg(x, p)`), a
    figure's or an image's save (`plt.savefig(p)`, `Image.fromarray(a).save(p)`)."""
    m = method_call(call)
    if m is not None and m[1] == "savefig":
        return True
    if m is not None and m[1] == "save" and _built_by(m[0], env, ("PIL",), None):
        return True
    return _unread_function_named(call, env, _SAVING_VERBS)


def _built_by(receiver: cst.BaseExpression, env: Env, libraries: tuple[str, ...], class_name: re.Pattern | None, depth: int = 0) -> bool:
    """Whether what a name holds was made by a call into one of the (imported) libraries, or by a class
    whose name matches."""
    if type(receiver) is cst.Call:
        values, name = [receiver], None
    else:
        name = dotted(receiver)
        if not name or depth > 3:
            return False
        if name in env.bound and not env.values_of(name):
            caller, arg = env.bound[name]
            return _built_by(arg, caller, libraries, class_name, depth + 1)
        values = env.values_of(name)
    for value in values:
        if type(value) is not cst.Call:
            continue
        qual = env.qualify(value.func) or ""
        imported = (dotted(value.func) or "").split(".")[0] in env.aliases.map
        if imported and any(qual == lib or qual.startswith(lib + ".") for lib in libraries):
            return True
        local = type(value.func) is cst.Name and value.func.value in env.module_classes
        if class_name is not None and class_name.search(qual.rsplit(".", 1)[-1]) and not local:
            return True  # a class of this file is read instead: a `MetricLogger` that sums is bookkeeping
        if name is None and isinstance(value.func, cst.Attribute):  # `Image.fromarray(a).convert("RGB").save(p)`
            return _built_by(value.func.value, env, libraries, class_name, depth + 1)
    return False


# Verbs that name a function by its I/O: used only where the function's body is out of the analysis's
# reach (imported from a module it does not have), as a reader of the loop would.
_REPORTING_VERBS = frozenset(
    {"log", "print", "plot", "visual", "visualize", "visualise", "draw", "display", "show", "summarize", "summarise", "report"}
)
_SAVING_VERBS = frozenset({"save", "saveimg", "savefig", "dump", "imwrite", "imsave", "write", "export"})
# `log_metrics(...)` reports; `log_prob(...)`, `log_softmax(...)`, `log_det(...)` compute
_LOG_MATH = re.compile(
    r"^log_?(prob|probs|softmax|sigmoid|sum|sumexp|likelihood|lik|det|density|normal|pdf|cdf|partition|posterior|prior|"
    r"marginal|gamma|beta|ratio|cosh|1p|mean|var|std|exp|add|diff|norm|odds|loss|p|q|z|px|pz|qz)(_|$)",
    re.I,
)
_COMPUTING_LIBRARIES = ("torch", "numpy", "math", "scipy", "sklearn", "jax", "einops", "random", "os", "sys", "builtins")


def _unread_function_named(call: cst.Call, env: Env, verbs: frozenset[str]) -> bool:
    """A function the analysis cannot read whose name starts with one of the verbs: `visual(gt, pred,
    path)` from `utils.tools`, `utils.saveimg(img, path)`, `log_per_step(writer, info)`."""
    func = call.func
    if isinstance(func, cst.Name):
        name = func.value
        if name in PURE_BUILTINS or env.module is not None and _defined_here(func, env):
            return False
        if name in env.scope.values or name in env.module_scope.values:
            return False  # a variable holding a callable: what it holds is not named by the verb
        if env.aliases.map.get(name, "").split(".")[0] in _COMPUTING_LIBRARIES:
            return False  # `from math import log`
    elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in env.aliases.map:
        if env.aliases.map[func.value.value].split(".")[0] in _COMPUTING_LIBRARIES:
            return False
        name = func.attr.value
    else:
        return False
    if name.lower().startswith("log"):
        return "log" in verbs and not _LOG_MATH.match(name) and re.match(r"^log(_|[A-Z]|$)", name) is not None
    verb = re.match(r"[a-z]+|[A-Z][a-z]+", name)  # save_model, saveImage, print0
    return verb is not None and verb.group().lower() in verbs
