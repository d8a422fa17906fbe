"""logging-io: host side effects that a graph replay would skip."""

import libcst as cst

from graphify.analysis.checker import code_of, is_logging_call
from graphify.analysis.calls import method_call
from graphify.rules.registry import rule

LOGGING = rule(
    "GFY511",
    "host-logging-in-step",
    "logging-io",
    "warning",
    "print, logging, progress bars and metric loggers run only once, at capture",
    True,
)
CHECKPOINT = rule(
    "GFY512", "file-io-in-step", "logging-io", "warning", "`torch.save` and file writes in the step run only once, at capture", True
)

RULES = (LOGGING, CHECKPOINT)


_FILE_IO = {"torch.save", "numpy.save", "numpy.savez", "json.dump", "pickle.dump", "open", "shutil.copy", "shutil.copyfile"}


def check(ck):
    for call, site in ck.calls():
        env = site.env
        if is_logging_call(call, env):
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
        m = method_call(call)
        is_save = m is not None and m[1] in ("save_pretrained", "save_checkpoint", "save_state")
        if qual in _FILE_IO or is_save or (isinstance(call.func, cst.Name) and call.func.value.startswith("save_")):
            yield ck.finding(
                CHECKPOINT,
                call,
                site,
                f"`{code_of(call)}` would run only once, at capture",
                "save between replays, outside the captured region",
                True,
            )
