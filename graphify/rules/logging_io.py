"""logging-io: host side effects that a graph replay would skip."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.logging_calls import is_file_write, is_logging_call, is_named_as_reporting
from graphify.analysis.calls import is_periodic_gpu_branch, method_call
from graphify.analysis.names import dotted
from graphify.analysis.statements import walk
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.registry import rule

LOGGING = rule(
    "GFY511",
    "host-logging-in-step",
    "logging-io",
    "warning",
    "print, logging, progress bars and metric loggers run only once, at capture",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)
CHECKPOINT = rule(
    "GFY512",
    "file-io-in-step",
    "logging-io",
    "warning",
    "`torch.save` and file writes in the step run only once, at capture",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)

PROFILER = rule(
    "GFY513",
    "profiler-in-step",
    "logging-io",
    "warning",
    "profiler schedules and CUDA memory recording advance on the host, once per step; a replay does not call them",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)

RULES = (LOGGING, CHECKPOINT, PROFILER)


_FILE_IO = {"torch.save", "numpy.save", "numpy.savez", "json.dump", "pickle.dump", "open", "shutil.copy", "shutil.copyfile"}
# Files and directories changed or listed on disk: checkpoint rotation, output folders.
_FILE_SYSTEM = {
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


def _periodic_saves(call: cst.Call, site, ck):
    """File writes in a function of this file called from periodic work (`if step % k == 0: ...; self.save(k)`):
    the step's walk does not enter calls there, as that block runs eagerly between replays, but a checkpoint
    written there is still a host effect of the step as written."""
    if not any(isinstance(a, cst.If) and is_periodic_gpu_branch(a, site.env) for a in site.ancestors):
        return
    module, func = site.block.module, call.func
    cls = site.env.func.cls if site.env.func is not None else None
    if isinstance(func, cst.Name) and func.value in module.functions:
        callee = module.functions[func.value]
    elif isinstance(func, cst.Attribute) and dotted(func.value) == "self" and cls is not None:
        callee = module.method(cls, func.attr.value)
    else:
        return
    for node in walk(callee.body) if callee is not None else ():
        if type(node) is cst.Call and (module.aliases.qualify(node.func) or "") in _FILE_IO | _FILE_SYSTEM:
            yield ck.finding_at(
                CHECKPOINT,
                node,
                module,
                f"`{code_of(node)}` (called from periodic work in the step) would run only once, at capture",
                "save between replays, outside the captured region",
                True,
            )


def _result_unused(call: cst.Call, site) -> bool:
    """`visual(gt, pred, path)` as a statement of its own: a call kept for its effect, not its value."""
    parent = site.ancestors[-1] if site.ancestors else None
    return isinstance(parent, cst.Expr) and parent.value is call


def check(ck):
    for call, site in ck.calls():
        env = site.env
        yield from _periodic_saves(call, site, ck)
        if is_logging_call(call, env) or (_result_unused(call, site) and is_named_as_reporting(call, env)):
            yield ck.finding(
                LOGGING,
                call,
                site,
                f"`{code_of(call)}` would run only once, at capture",
                "log after the replay, from the graph's static outputs",
                True,
            )
            continue
        qual = env.qualify(call.func) or ""
        if qual.startswith(_PROFILER_CALLS) or _is_profiler_step(call, env):
            yield ck.finding(
                PROFILER,
                call,
                site,
                f"`{code_of(call)}` would run only once, at capture",
                "step the profiler between replays, outside the captured region",
                True,
            )
        elif (
            qual in _FILE_IO
            or qual in _FILE_SYSTEM
            or _is_saver(call, qual)
            or _is_file_write(call, env)
            or (_result_unused(call, site) and is_file_write(call, env))
        ):
            yield ck.finding(
                CHECKPOINT,
                call,
                site,
                f"`{code_of(call)}` would run only once, at capture",
                "save between replays, outside the captured region",
                True,
            )
