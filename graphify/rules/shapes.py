"""dynamic-shape: per-step input shapes that differ from the captured ones."""

import libcst as cst

from graphify.analysis.checker import code_of, is_true, kwarg
from graphify.analysis.names import dotted
from graphify.analysis.statements import walk
from graphify.rules.registry import rule

NO_DROP_LAST = rule(
    "GFY251",
    "loader-without-drop-last",
    "dynamic-shape",
    "warning",
    "a DataLoader without `drop_last=True` yields a smaller last batch",
    True,
)
VARIABLE_LENGTH = rule(
    "GFY252",
    "variable-length-batch",
    "dynamic-shape",
    "error",
    "per-batch padding, packing or slicing to a per-step length changes shapes every step",
    False,
)

RULES = (NO_DROP_LAST, VARIABLE_LENGTH)


_PADDING = {"pad_sequence", "pack_padded_sequence", "pack_sequence", "pad_packed_sequence"}
# Hugging Face collators that pad each batch to its longest sequence unless told `padding="max_length"`
_PADDING_COLLATORS = {"DataCollatorWithPadding", "DataCollatorForSeq2Seq", "DataCollatorForTokenClassification"}


def _pads_to_longest(call: cst.Call, aliases) -> bool:
    """`pad_sequence(...)`, or a call told `padding="longest"` / `padding=True` (`tokenizer.pad(...)`)."""
    if (aliases.qualify(call.func) or dotted(call.func) or "").rsplit(".", 1)[-1] in _PADDING:
        return True
    padding = kwarg(call, "padding")
    return padding is not None and (is_true(padding) or (isinstance(padding, cst.SimpleString) and padding.evaluated_value == "longest"))


def _padding_collate(ck, collate: cst.BaseExpression | None, module):
    """A DataLoader's `collate_fn` that pads each batch to its own longest sequence: a function of this
    file (by name, or through functools.partial) calling a padding function, or a padding collator."""
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
    """The DataLoader(...) call an iterable comes from, with the module it is in."""
    if depth > 6 or expr is None:
        return None
    if isinstance(expr, cst.Call):
        last = (env.qualify(expr.func) or "").rsplit(".", 1)[-1]
        if last == "DataLoader":
            return expr, env.module
        if last in ("iter", "enumerate", "tqdm", "cycle", "islice") and expr.args:
            return _dataloader(expr.args[0].value, env, depth + 1)
        return None
    name = dotted(expr)
    if name is None:
        return None
    if name in env.bound:
        caller, arg = env.bound[name]
        return _dataloader(arg, caller, depth + 1)
    for value in reversed(env.values_of(name)):
        found = _dataloader(value, env, depth + 1)
        if found is not None:
            return found
    return None


def check(ck):
    seen = set()
    for iterable, env in ck.loop_iterables():
        found = _dataloader(iterable, env)
        if found is None or id(found[0]) in seen:
            continue
        call, module = found
        seen.add(id(call))
        yield from _padding_collate(ck, kwarg(call, "collate_fn"), module)
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
