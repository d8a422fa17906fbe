"""What the dynamic-shape rules share: the DataLoader (or other loader) a loop iterates, wherever it is built."""

import libcst as cst

from graphify.analysis.names import dotted
from graphify.analysis.tree import returns
from graphify.analysis.vocabulary import ACCELERATOR

# the packages whose loaders batch graphs (a PyG `Batch`, DGL blocks or a batched `DGLGraph`): objects, not
# tensors, sized by the graphs sampled into each batch
_GRAPH_PACKAGES = ("torch_geometric.", "dgl.")
# torchtext's iterator that batches sentences of similar lengths and pads each batch to its longest
BUCKETING_LOADERS = {"torchtext.data.BucketIterator", "torchtext.legacy.data.BucketIterator", "torchtext.data.iterator.BucketIterator"}


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
        if last == "DataLoader" or env.qualify(expr.func) in BUCKETING_LOADERS or is_graph_loader(expr, env):
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


def is_graph_loader(call: cst.Call, env) -> bool:
    name = env.qualify(call.func) or ""
    return name.startswith(_GRAPH_PACKAGES) and name.endswith("Loader")


def loaders(ck):
    """`(call, env)` of each loader the loop iterates, once each: the call that builds it and where. Its rules'
    findings about the loaders come first, loader by loader (Finding.order `(0, loader, rule)`), then those in the
    step (`(1, position)`)."""
    seen = set()
    for iterable, env in ck.loop_iterables():
        found = _dataloader(iterable, env)
        if found is None or id(found[0]) in seen:
            continue
        seen.add(id(found[0]))
        yield found
