"""in-loop-allocation: tensors built from host data inside the step."""

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.calls import iter_nodes
from graphify.analysis.devices import legacy_tensor_type
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.registry import rule

HOST_DATA = rule(
    "GFY201",
    "tensor-from-host-data",
    "in-loop-allocation",
    "error",
    "`torch.tensor`/`as_tensor`/`from_numpy` of host data: the value is frozen at capture",
    True,
    Fix(FixKind.DRAWN, Applicability.SAFE),
)
FACTORY_HOST_ARGS = rule(
    "GFY202",
    "factory-with-step-values",
    "in-loop-allocation",
    "error",
    "a tensor factory whose size or fill value changes per step is frozen at capture",
    False,
)

RULES = (HOST_DATA, FACTORY_HOST_ARGS)


_FROM_HOST = {
    "tensor",
    "as_tensor",
    "from_numpy",
    "Tensor",
    "FloatTensor",
    "LongTensor",
    "IntTensor",
    "BoolTensor",
    "HalfTensor",
    "DoubleTensor",
    "ByteTensor",
}


def _host_data(expr, env) -> bool:
    """Values, not sizes: a list literal or something numpy built."""
    if isinstance(expr, (cst.List, cst.Tuple, cst.ListComp)):
        return True
    return isinstance(expr, cst.Call) and (env.qualify(expr.func) or "").startswith("numpy.")


_FACTORIES = {"zeros", "ones", "full", "empty", "arange", "linspace", "logspace", "randn", "rand", "randint", "randperm", "eye", "normal"}


def check(ck):
    for call, site in ck.calls():
        env = site.env
        qual = env.qualify(call.func) or ""
        if not qual.startswith("torch.") and call.args and legacy_tensor_type(call.func, env) and _host_data(call.args[0].value, env):
            qual = "torch.Tensor"  # Tensor(np.random.normal(...)), Tensor = torch.cuda.FloatTensor
        if not qual.startswith("torch."):
            continue
        last = qual.rsplit(".", 1)[-1]
        if last in _FROM_HOST:
            # Input preparation before the step (in the body, or in a helper such as get_batch() called
            # there) stays eager; anywhere else the value would be frozen at capture.
            removable = ck.before_gpu_work(call)
            yield ck.finding(
                HOST_DATA,
                call,
                site,
                f"`{code_of(call)}` builds a tensor from host data inside the step",
                "build per-step inputs before the step and copy them into a static buffer; create constants once before the loop",
                removable,
            )
        elif last in _FACTORIES:
            used = sorted({n.value for a in call.args for n in iter_nodes(a.value) if isinstance(n, cst.Name) and n.value in ck.counters})
            if used:
                yield ck.finding(
                    FACTORY_HOST_ARGS,
                    call,
                    site,
                    f"`{code_of(call)}` depends on per-step host value `{used[0]}`, frozen at capture",
                    f"keep `{used[0]}` in a device tensor updated with `fill_()` before each replay",
                )
