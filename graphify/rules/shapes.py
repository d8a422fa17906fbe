"""dynamic-shape: per-step input shapes that differ from the captured ones."""

import libcst as cst

from graphify.analysis.calls import local_function
from graphify.analysis.checker import code_of, is_true, kwarg
from graphify.analysis.names import dotted
from graphify.analysis.statements import unguarded, walk
from graphify.analysis.tree import returns
from graphify.analysis.vocabulary import ACCELERATOR
from graphify.model import Applicability, Fix, FixKind, Partial
from graphify.rules.registry import rule

NO_DROP_LAST = rule(
    "GFY251",
    "loader-without-drop-last",
    "dynamic-shape",
    "warning",
    "a DataLoader without `drop_last=True` yields a smaller last batch",
    True,
    Fix(FixKind.IN_PLACE, Applicability.SAFE),
)
VARIABLE_LENGTH = rule(
    "GFY252",
    "variable-length-batch",
    "dynamic-shape",
    "error",
    "per-batch padding, packing or slicing to a per-step length changes shapes every step",
    False,
    Fix(partial=Partial.UNLESS_UNREAD),
)

GRAPH_BATCH = rule(
    "GFY253",
    "graph-batch",
    "dynamic-shape",
    "error",
    "a graph library's loader (PyG, DGL) batches graphs whose node and edge counts change every batch",
    False,
    Fix(partial=Partial.NEVER),
)

RULES = (NO_DROP_LAST, VARIABLE_LENGTH, GRAPH_BATCH)

# the packages whose loaders batch graphs (a PyG `Batch`, DGL blocks or a batched `DGLGraph`): objects, not
# tensors, sized by the graphs sampled into each batch
_GRAPH_PACKAGES = ("torch_geometric.", "dgl.")


_PADDING = {"pad_sequence", "pack_padded_sequence", "pack_sequence", "pad_packed_sequence"}
# Hugging Face collators that pad each batch to its longest sequence unless told `padding="max_length"`
_PADDING_COLLATORS = {"DataCollatorWithPadding", "DataCollatorForSeq2Seq", "DataCollatorForTokenClassification"}
# torchtext's iterator that batches sentences of similar lengths and pads each batch to its longest
_BUCKETING_LOADERS = {"torchtext.data.BucketIterator", "torchtext.legacy.data.BucketIterator", "torchtext.data.iterator.BucketIterator"}


def _pads_to_longest(call: cst.Call, aliases) -> bool:
    """`pad_sequence(...)`, or a call told `padding="longest"` / `padding=True` (`tokenizer.pad(...)`)."""
    if (aliases.qualify(call.func) or dotted(call.func) or "").rsplit(".", 1)[-1] in _PADDING:
        return True
    padding = kwarg(call, "padding")
    return padding is not None and (is_true(padding) or (isinstance(padding, cst.SimpleString) and padding.evaluated_value == "longest"))


def _padding_collate(ck, collate: cst.BaseExpression | None, env):
    """A DataLoader's `collate_fn` that pads each batch to its own longest sequence: a function of this
    file or of the function building the loader (by name, or through functools.partial) calling a padding
    function, or a padding collator."""
    module = env.module
    if isinstance(collate, cst.Call):
        name = module.aliases.qualify(collate.func) or dotted(collate.func) or ""
        if name.rsplit(".", 1)[-1] == "partial" and collate.args:
            collate = collate.args[0].value
        elif name.rsplit(".", 1)[-1] in _PADDING_COLLATORS:
            padding = kwarg(collate, "padding")
            if not (isinstance(padding, cst.SimpleString) and padding.evaluated_value == "max_length"):
                yield ck.finding_at(
                    VARIABLE_LENGTH,
                    collate,
                    module,
                    f"`{code_of(collate)}` pads each batch to its longest sequence: every batch has its own shape",
                    'pad to a fixed length (`padding="max_length"`), or to a few bucket lengths, one graph each',
                )
            return
    if not isinstance(collate, cst.Name):
        return
    defs = [n for n in walk(module.tree) if isinstance(n, cst.FunctionDef) and n.name.value == collate.value]
    local = local_function(collate.value, env) if env.func is not None else None
    if local is not None:
        defs = [local]
    if len(defs) != 1:
        return
    calls = [n for n in walk(defs[0]) if isinstance(n, cst.Call)]
    if any((module.aliases.qualify(c.func) or "") == "torch.nn.functional.pad" for c in calls):
        return  # padded on to a fixed width afterwards (`F.pad(x, (0, MAX_LEN - x.shape[1]))`)
    for node in calls:
        if _pads_to_longest(node, module.aliases):
            yield ck.finding_at(
                VARIABLE_LENGTH,
                node,
                module,
                f"`{code_of(node)}` in the loader's collate function pads each batch to its longest sequence: every batch has its own shape",
                'pad to a fixed length (`padding="max_length"`), or to a few bucket lengths, one graph each',
            )


def _dataloader(expr, env, depth=0):
    """The DataLoader(...) call an iterable comes from, with the env it is read in: through wrappers
    (`cycle(dl)`, `accelerator.prepare(dl)`), parameters, attributes set in another method
    (`self.dl = cycle(dl)` in `__init__`), and tuples a function of the file returns or `prepare` hands back."""
    if depth > 6 or expr is None:
        return None
    if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Call) and _index_of(expr) is not None:
        part = _returned_part(expr.value, _index_of(expr), env)
        return _dataloader(part[0], part[1], depth + 1) if part is not None else None
    if isinstance(expr, cst.Call):
        last = (env.qualify(expr.func) or "").rsplit(".", 1)[-1]
        if last == "DataLoader" or env.qualify(expr.func) in _BUCKETING_LOADERS or _is_graph_loader(expr, env):
            return expr, env
        if (last in ("iter", "enumerate", "tqdm", "cycle", "islice") and expr.args) or (_is_prepare(expr, env) and len(expr.args) == 1):
            return _dataloader(expr.args[0].value, env, depth + 1)
        part = _returned_part(expr, None, env)
        return _dataloader(part[0], part[1], depth + 1) if part is not None else None
    name = dotted(expr)
    if name is None:
        return None
    if name in env.bound:
        caller, arg = env.bound[name]
        return _dataloader(arg, caller, depth + 1)
    for value in reversed(env.values_of(name)):
        found = _dataloader(value, _assigning_env(name, value, env), depth + 1)
        if found is not None:
            return found
    return None


def _index_of(expr: cst.Subscript) -> int | None:
    """`call(...)[i]`: how the scope records `a, b = call(...)`."""
    index = expr.slice[0].slice if len(expr.slice) == 1 else None
    return int(index.value.value) if isinstance(index, cst.Index) and isinstance(index.value, cst.Integer) else None


def _is_prepare(call: cst.Call, env) -> bool:
    """`accelerator.prepare(model, optimizer, loader, ...)` hands back its arguments, wrapped, in order."""
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "prepare" and env.kind_of(call.func.value) == ACCELERATOR


def _returned_part(call: cst.Call, index: int | None, env):
    """The expression (and the env it is read in) that `call(...)[index]` unpacks (`call(...)` with no
    index): `prepare`'s argument, or the value or tuple element a function of this file returns."""
    if _is_prepare(call, env) and index is not None:
        args = [a for a in call.args if a.keyword is None and not a.star]
        return (args[index].value, env) if index < len(args) else None
    module = env.module
    if not isinstance(call.func, cst.Name) or module is None or call.func.value not in module.functions:
        return None
    func = module.functions[call.func.value]
    for ret in returns(func):
        if index is None and not isinstance(ret.value, cst.Tuple):
            return ret.value, module.function_info(func, None).new_env()
        if index is not None and isinstance(ret.value, cst.Tuple) and index < len(ret.value.elements):
            return ret.value.elements[index].value, module.function_info(func, None).new_env()
    return None


def _assigning_env(name: str, value, env):
    """`self.dl` is assigned in another method (`__init__`): its value reads that method's names."""
    cls = env.func.cls if name.startswith("self.") and env.func is not None and env.module is not None else None
    for stmt in cls.body.body if cls is not None else ():
        if isinstance(stmt, cst.FunctionDef) and stmt is not env.func.node:
            if any(v is value for v in env.module.function_info(stmt, cls).scope.values.get(name, ())):
                return env.module.function_info(stmt, cls).new_env()
    return env


def _is_graph_loader(call: cst.Call, env) -> bool:
    name = env.qualify(call.func) or ""
    return name.startswith(_GRAPH_PACKAGES) and name.endswith("Loader")


def _graph_batch(ck, call: cst.Call, loader_env):
    """The first statement of the loop body that reads the graph batch the loop's target holds, where the
    step takes its per-batch sizes from it."""
    loop = ck.loop.node
    if not isinstance(loop, cst.For) or not isinstance(loop.body, cst.IndentedBlock):
        return
    items = {n.value for n in walk(loop.target) if isinstance(n, cst.Name)}
    for stmt in unguarded(loop.body.body):
        read = next((n for n in walk(stmt) if isinstance(n, cst.Name) and n.value in items), None)
        if read is not None:
            yield ck.finding_at(
                GRAPH_BATCH,
                read,
                ck.loop.module,
                f"`{read.value}` comes from `{code_of(call.func)}`, a graph library's loader: its batches' node and edge counts "
                "change with every batch, and the runtime tells its batch objects apart only by identity: no graph would replay",
                "leave this loop eager, or pad each batch to fixed node and edge counts and pass the padded tensors",
            )
            return


def check(ck):
    seen = set()
    for iterable, env in ck.loop_iterables():
        found = _dataloader(iterable, env)
        if found is None or id(found[0]) in seen:
            continue
        call, loader_env = found
        module = loader_env.module
        seen.add(id(call))
        if _is_graph_loader(call, loader_env):
            yield from _graph_batch(ck, call, loader_env)
        if loader_env.qualify(call.func) in _BUCKETING_LOADERS:
            yield ck.finding_at(
                VARIABLE_LENGTH,
                call,
                module,
                f"`{code_of(call, 50)}` pads each batch to its longest sentence: every batch has its own shape",
                "give the fields a `fix_length`, or bucket to a few fixed lengths, one graph each",
            )
            continue
        yield from _padding_collate(ck, kwarg(call, "collate_fn"), loader_env)
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
