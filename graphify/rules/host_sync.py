"""host-sync: operations that make the CPU wait for the GPU."""

import libcst as cst

from graphify.analysis.checker import (
    code_of,
    is_host_move,
    is_true,
    kwarg,
)
from graphify.analysis.calls import method_call
from graphify.analysis.logging_calls import is_logging_call
from graphify.analysis.names import dotted
from graphify.analysis.vocabulary import DDP, LOSS, MODEL
from graphify.rules.host_tensors import host_batch_names, model_output, on_host
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.registry import rule

ITEM = rule(
    "GFY001",
    "tensor-item",
    "host-sync",
    "error",
    "`.item()` on a tensor copies it to the host and waits for the GPU",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)
TOLIST = rule(
    "GFY002",
    "tensor-tolist",
    "host-sync",
    "error",
    "`.tolist()` on a tensor copies it to the host and waits for the GPU",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)
TO_CPU = rule(
    "GFY003",
    "tensor-to-cpu",
    "host-sync",
    "error",
    "`.cpu()` / `.to('cpu')` copies a tensor to the host and waits for the GPU",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)
NUMPY = rule(
    "GFY004",
    "tensor-numpy",
    "host-sync",
    "error",
    "`.numpy()` needs the tensor on the host",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)
SCALAR = rule(
    "GFY005",
    "tensor-to-python-scalar",
    "host-sync",
    "error",
    "`float()`, `int()`, `bool()` of a tensor read its value on the host",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)
FORMAT = rule(
    "GFY006",
    "tensor-formatted",
    "host-sync",
    "error",
    "a tensor printed, logged or formatted into a string is read on the host",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)
SYNCHRONIZE = rule(
    "GFY007",
    "cuda-synchronize",
    "host-sync",
    "error",
    "`torch.cuda.synchronize()` and stream/event synchronization are illegal during capture",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)
# Sized from data: a dynamic shape first (the sync follows from it), so their category is dynamic-shape.
DYNAMIC_OUTPUT = rule(
    "GFY008",
    "data-dependent-output-size",
    "dynamic-shape",
    "error",
    "`nonzero`, `unique`, `masked_select`, one-argument `where` size their output from data",
    False,
)
MASK_INDEX = rule(
    "GFY009", "boolean-mask-indexing", "dynamic-shape", "error", "indexing with a boolean mask gives a data-dependent shape", False
)
CLIP_NONFINITE = rule(
    "GFY010",
    "clip-error-if-nonfinite",
    "host-sync",
    "error",
    "`clip_grad_norm_(..., error_if_nonfinite=True)` checks the norm on the host",
    False,
)
EMPTY_CACHE = rule(
    "GFY011",
    "empty-cache-in-step",
    "host-sync",
    "error",
    "`torch.cuda.empty_cache()` in the step: costly, and on some PyTorch versions it breaks capture",
    True,
    Fix(FixKind.MOVED_AFTER, Applicability.SAFE),
)

RULES = (ITEM, TOLIST, TO_CPU, NUMPY, SCALAR, FORMAT, SYNCHRONIZE, DYNAMIC_OUTPUT, MASK_INDEX, CLIP_NONFINITE, EMPTY_CACHE)

_DYNAMIC = {"nonzero", "unique", "unique_consecutive", "argwhere", "masked_select"}
_READ_AFTER = "read it after the step (graphify rewrite reads the graph's static output after each replay)"


def _library_metric(receiver: cst.BaseExpression, env) -> bool:
    """A Hugging Face `evaluate` metric (`evaluate.load("glue")`, `datasets.load_metric`): it converts the
    tensors it is fed to Python and NumPy data."""
    name = dotted(receiver)
    return bool(name) and any(
        isinstance(v, cst.Call) and ((env.qualify(v.func) or "").startswith("evaluate.") or env.qualify(v.func) == "datasets.load_metric")
        for v in env.values_of(name)
    )


_MASK_FUNCTIONS = {"isfinite", "isnan", "isinf", "logical_and", "logical_or", "logical_not", "eq", "ne", "gt", "lt", "ge", "le"}
_MASK_METHODS = _MASK_FUNCTIONS | {"bool", "byte", "logical_xor"}


def _is_boolean_mask(index: cst.BaseExpression, env) -> bool:
    if isinstance(index, cst.Comparison) or (isinstance(index, cst.UnaryOperation) and isinstance(index.operator, cst.BitInvert)):
        return env.is_tensor(index)
    if isinstance(index, cst.BinaryOperation) and isinstance(index.operator, (cst.BitAnd, cst.BitOr)):
        return env.is_tensor(index)
    if isinstance(index, cst.Call):
        m = method_call(index)
        if m is not None and m[1] in _MASK_METHODS and env.is_tensor(m[0]):
            return True  # `labels.bool()`, `mask.byte()` (a uint8 mask indexes as a boolean one), `x.ne(0)`
        qual = env.qualify(index.func) or ""
        if qual in ("numpy.where", "numpy.nonzero", "torch.where") and len(index.args) == 1:
            return True  # the indexes where a condition holds: as many as it holds for
        return qual.rsplit(".", 1)[-1] in _MASK_FUNCTIONS
    if isinstance(index, cst.Name):
        return any(_is_boolean_mask(v, env) for v in env.values_of(index.value) if not isinstance(v, cst.Name))
    return False


def _assigned_a_scalar(site) -> bool:
    """`x[mask] = 0` becomes `masked_fill_`, which keeps shapes fixed."""
    parent = site.ancestors[-1] if site.ancestors else None
    if isinstance(parent, cst.AssignTarget):
        stmt = site.ancestors[-2] if len(site.ancestors) > 1 else None
        return isinstance(stmt, cst.Assign) and not site.env.is_tensor(stmt.value)
    return False


def check(ck):
    host_batch = host_batch_names(ck)
    for node, site in ck.nodes():
        env = site.env
        if isinstance(node, cst.Call):
            yield from _check_call(ck, node, site, env, host_batch)
        elif isinstance(node, cst.FormattedStringExpression) and env.is_tensor(node.expression):
            if not any(isinstance(a, cst.Call) and is_logging_call(a, env) for a in site.ancestors):
                yield ck.finding(
                    FORMAT,
                    node,
                    site,
                    f"tensor `{code_of(node.expression)}` formatted into a string",
                    f"format `{code_of(node.expression)}.item()` outside the step, or log the tensor after the replay",
                    ck.host_read_removable(node, site),
                )
        elif isinstance(node, cst.Subscript) and site.block is ck.region.body_block and on_host(node.value, host_batch):
            device_index = [
                el.slice.value for el in node.slice if isinstance(el.slice, cst.Index) and model_output(el.slice.value, ck, env)
            ]
            if device_index:
                yield ck.finding(
                    TO_CPU,
                    node,
                    site,
                    f"`{code_of(node)}` indexes a host tensor with device tensor `{code_of(device_index[0])}`, copied to the host",
                    "move the host tensor to the device before the step, or index it after the step",
                    ck.host_read_removable(node, site),
                )
        elif isinstance(node, cst.Subscript) and env.is_tensor(node.value) and not _assigned_a_scalar(site):
            for el in node.slice:
                if isinstance(el.slice, cst.Index) and _is_boolean_mask(el.slice.value, env):
                    yield ck.finding(
                        MASK_INDEX,
                        node,
                        site,
                        f"boolean-mask indexing `{code_of(node)}`",
                        "use `torch.where(mask, x, 0)` or `masked_fill` to keep shapes fixed",
                    )


def _check_call(ck, call, site, env, host_batch):
    m = method_call(call)
    qual = env.qualify(call.func) or ""
    if m is not None:
        receiver, name = m
        kind = env.kind_of(receiver)
        subject = code_of(receiver)
        if site.block is ck.region.body_block and on_host(receiver, host_batch):
            pass  # a batch item the step never moved to the device: reading it waits for nothing
        elif name == "item" and not call.args and not env.is_host(receiver) and kind is None:
            yield ck.finding(ITEM, call, site, f"`{subject}.item()` waits for the GPU", _READ_AFTER, ck.host_read_removable(call, site))
        elif name == "tolist" and env.is_tensor(receiver):
            yield ck.finding(TOLIST, call, site, f"`{subject}.tolist()` waits for the GPU", _READ_AFTER, ck.host_read_removable(call, site))
        elif is_host_move(call, env) and kind in (MODEL, DDP):
            yield ck.finding(
                TO_CPU,
                call,
                site,
                f"`{code_of(call)}` copies the module's weights to the host every step",
                "keep the module on the device during training; offload it between epochs, if at all",
                False,
            )
        elif is_host_move(call, env) and kind != LOSS and not env.is_host(receiver):
            yield ck.finding(TO_CPU, call, site, f"`{code_of(call)}` copies to the host", _READ_AFTER, ck.host_read_removable(call, site))
        elif name == "numpy" and not env.is_host(receiver) and kind is None:
            yield ck.finding(
                NUMPY, call, site, f"`{subject}.numpy()` needs the tensor on the host", _READ_AFTER, ck.host_read_removable(call, site)
            )
        elif name == "synchronize" and not qual.startswith("torch.distributed"):
            yield ck.finding(
                SYNCHRONIZE,
                call,
                site,
                f"`{code_of(call)}` blocks the host",
                "remove it from the step; time with CUDA events outside the replayed region",
                ck.host_read_removable(call, site),
            )
        elif name in _DYNAMIC and env.is_tensor(receiver):
            yield ck.finding(
                DYNAMIC_OUTPUT,
                call,
                site,
                f"`{code_of(call)}` has a data-dependent output size",
                "use fixed-size alternatives (`torch.where(mask, x, 0)`, masks multiplied in) or move this out of the step",
            )
        if name in ("add_batch", "add", "compute") and _library_metric(receiver, env):
            fed = [a.value for a in call.args if env.is_tensor(a.value)]
            if fed:
                yield ck.finding(
                    TO_CPU,
                    call,
                    site,
                    f"`{subject}.{name}(...)` converts `{code_of(fed[0])}` to host data",
                    "feed the metric after the step (graphify rewrite reads the graph's static output after each replay)",
                    ck.host_read_removable(call, site),
                )
    last = qual.rsplit(".", 1)[-1]
    if qual.startswith("torch.") and (last in _DYNAMIC or (last == "where" and len(call.args) == 1)):
        yield ck.finding(
            DYNAMIC_OUTPUT,
            call,
            site,
            f"`{code_of(call)}` has a data-dependent output size",
            "use fixed-size alternatives (three-argument `torch.where`, masking) or move this out of the step",
        )
    elif last in ("clip_grad_norm_", "clip_grad_norm") and is_true(kwarg(call, "error_if_nonfinite")):
        yield ck.finding(
            CLIP_NONFINITE,
            call,
            site,
            f"`{code_of(call)}` checks the norm on the host",
            "drop `error_if_nonfinite=True`; check the returned norm after the step instead",
        )
    elif qual == "torch.cuda.empty_cache":
        yield ck.finding(
            EMPTY_CACHE,
            call,
            site,
            "`torch.cuda.empty_cache()` inside the step",
            "call it outside the training step, if at all",
            ck.host_read_removable(call, site),
        )
    elif (
        isinstance(call.func, cst.Name)
        and call.func.value in ("float", "int", "bool", "complex")
        and call.args
        and env.is_tensor(call.args[0].value)
    ):
        yield ck.finding(
            SCALAR, call, site, f"`{code_of(call)}` reads a tensor on the host", _READ_AFTER, ck.host_read_removable(call, site)
        )
    elif is_logging_call(call, env) or (isinstance(call.func, cst.Name) and call.func.value in ("str", "repr")):
        tensors = [a.value for a in call.args if env.is_tensor(a.value)]
        tensors += [fs.expression for a in call.args for fs in _fstring_parts(a.value) if ck.is_tensor_here(fs.expression, site)]
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "format" and env.is_tensor(call.func.value):
            tensors.append(call.func.value)
        if tensors:
            # reported where the tensor is read: the f-string line of a call that spans lines
            module = site.block.module
            at = tensors[0] if module.position(tensors[0]).start.line != module.position(call).start.line else call
            yield ck.finding(
                FORMAT,
                at,
                site,
                f"tensor `{code_of(tensors[0])}` printed or logged from the step",
                f"log `{code_of(tensors[0])}.item()` after the step instead",
                ck.host_read_removable(call, site),
            )
    elif isinstance(call.func, cst.Attribute) and call.func.attr.value == "format" and any(env.is_tensor(a.value) for a in call.args):
        yield ck.finding(FORMAT, call, site, "tensor formatted into a string", _READ_AFTER, ck.host_read_removable(call, site))


def _fstring_parts(expr):
    if isinstance(expr, cst.FormattedString):
        return [p for p in expr.parts if isinstance(p, cst.FormattedStringExpression)]
    if isinstance(expr, cst.ConcatenatedString):  # f"..." f"..." over several lines
        return _fstring_parts(expr.left) + _fstring_parts(expr.right)
    return []
