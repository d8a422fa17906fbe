"""What the logging-io rules share: which calls log, step a profiler or write files."""

import libcst as cst

from graphify.analysis.logging_calls import is_file_write, is_logging_call, is_named_as_reporting
from graphify.analysis.calls import method_call
from graphify.analysis.names import dotted

FILE_IO = {"torch.save", "numpy.save", "numpy.savez", "json.dump", "pickle.dump", "open", "shutil.copy", "shutil.copyfile"}
# Files and directories changed or listed on disk: checkpoint rotation, output folders.
FILE_SYSTEM = {
    "os.remove",
    "os.unlink",
    "os.rename",
    "os.replace",
    "os.makedirs",
    "os.mkdir",
    "os.rmdir",
    "os.listdir",
    "shutil.rmtree",
    "shutil.move",
    "shutil.copy2",
    "shutil.copytree",
}
_PROFILER_CALLS = (
    "torch.profiler.",
    "torch.autograd.profiler.",
    "torch.cuda.memory._record_memory_history",
    "torch.cuda.memory._dump_snapshot",
)


def _is_file_write(call: cst.Call, env) -> bool:
    """`f.write(...)` on a file the code opened: `with open(path, "w") as f`, `f = open(...)`."""
    m = method_call(call)
    if m is None or m[1] not in ("write", "writelines"):
        return False
    name = dotted(m[0])
    return bool(name) and any(isinstance(v, cst.Call) and env.qualify(v.func) == "open" for v in env.values_of(name))


def _is_saver(call: cst.Call, qual: str) -> bool:
    """`save_image(...)`, `torchvision.utils.save_image(...)`, `saver.save_recovery(...)`."""
    m = method_call(call)
    return qual.rsplit(".", 1)[-1].startswith("save_") or (m is not None and m[1].startswith("save_"))


def _is_profiler_step(call: cst.Call, env) -> bool:
    m = method_call(call)
    if m is None or m[1] != "step":
        return False
    name = dotted(m[0]) or ""
    built = [v for v in env.values_of(name) if isinstance(v, cst.Call)]
    return any((env.qualify(v.func) or "").startswith(_PROFILER_CALLS) for v in built) or name.rsplit(".", 1)[-1].lstrip("_") in (
        "profiler",
        "prof",
    )


def _result_unused(call: cst.Call, site) -> bool:
    """`visual(gt, pred, path)` as a statement of its own: a call kept for its effect, not its value."""
    parent = site.ancestors[-1] if site.ancestors else None
    return isinstance(parent, cst.Expr) and parent.value is call


def logs(call: cst.Call, site) -> bool:
    """print, logging, a progress bar or metric logger, or a call named for reporting kept for its effect."""
    return is_logging_call(call, site.env) or (_result_unused(call, site) and is_named_as_reporting(call, site.env))


def steps_profiler(call: cst.Call, env) -> bool:
    qual = env.qualify(call.func) or ""
    return qual.startswith(_PROFILER_CALLS) or _is_profiler_step(call, env)


def writes_files(call: cst.Call, site) -> bool:
    """`torch.save`, `open`, a `save_*` call, a write to a file the code opened, files changed on disk."""
    env = site.env
    qual = env.qualify(call.func) or ""
    return (
        qual in FILE_IO
        or qual in FILE_SYSTEM
        or _is_saver(call, qual)
        or _is_file_write(call, env)
        or (_result_unused(call, site) and is_file_write(call, env))
    )
