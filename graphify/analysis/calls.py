"""Which calls run a backward pass, an optimizer step or a model; periodic branches; node iteration."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from graphify.analysis.names import dotted
from graphify.analysis.tree import children, memo
from graphify.analysis.values import Env
from graphify.analysis.tree import returns
from graphify.analysis.vocabulary import DDP, ENV, LOADER, MODEL, OPTIMIZER, SCALER, computes_per_step

NO_GRAD = ("no_grad", "inference_mode")
# Tested with `type(n) in`: libcst's node classes have no subclasses, and isinstance on their
# abstract-base-class metaclass costs a Python call for every node that is not one of them.
_SKIP = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})


def method_call(node: cst.CSTNode) -> tuple[cst.BaseExpression, str] | None:
    if type(node) is cst.Call and type(node.func) is cst.Attribute:
        return node.func.value, node.func.attr.value
    return None


def is_backward(call: cst.Call, env: Env) -> bool:
    m = method_call(call)
    if m is not None and m[1] in ("backward", "manual_backward"):
        return env.kind_of(m[0]) != ENV
    return env.qualify(call.func) == "torch.autograd.backward"


def is_optimizer_step(call: cst.Call, env: Env) -> bool:
    m = method_call(call)
    if m is None or m[1] != "step":
        return False
    kind = env.kind_of(m[0])
    return kind == OPTIMIZER or (kind == SCALER and bool(call.args))


def is_model_call(call: cst.Call, env: Env) -> bool:
    """`model(x)`, and a model's method or submodule that runs it: `model.forward(x)`, `model.encode(x)`,
    `model.transformer(x)` (not `model.to(device)` or `model.parameters()`)."""
    if env.kind_of(call.func) in (MODEL, DDP):
        return True
    func = call.func
    return isinstance(func, cst.Attribute) and computes_per_step(func.attr.value) and env.kind_of(func.value) in (MODEL, DDP)


def is_no_grad_item(expr: cst.BaseExpression, env: Env) -> bool:
    func = expr.func if isinstance(expr, cst.Call) else expr
    qual = env.qualify(func) or ""
    if qual.endswith(NO_GRAD):
        return True
    if qual.endswith("set_grad_enabled") and isinstance(expr, cst.Call) and expr.args:
        return dotted(expr.args[0].value) == "False"
    return False


def is_delegated_step(call: cst.Call, env: Env) -> bool:
    """A call that hands the loss and the optimizer to something else, which runs backward and the
    optimizer step out of sight: `loss_scaler(loss, optimizer, clip_grad=...)`."""
    values = [a.value for a in call.args if not a.star]
    if len(values) < 2 or is_backward(call, env) or is_optimizer_step(call, env):
        return False
    kinds = [env.kind_of(v) for v in values]
    if env.kind_of(call.func) == SCALER:  # `loss_scaler(loss, optimizer)`: a scaler object handed the optimizer
        return OPTIMIZER in kinds
    return (
        OPTIMIZER in kinds
        and LOADER not in kinds  # `train_one_epoch(model, loader, optimizer, ...)` runs many steps, not one
        and any(env._tensor(v, 0) is True and kind not in (MODEL, DDP) for v, kind in zip(values, kinds))  # a model is no loss
        and not _defined_here(call.func, env)
    )


_NESTED: dict[int, tuple[cst.CSTNode, dict[str, cst.FunctionDef]]] = memo()


def nested_functions(outer: cst.FunctionDef | cst.Module) -> dict[str, cst.FunctionDef]:
    """Functions defined anywhere inside `outer` (closures), by name; computed once per function."""
    cached = _NESTED.get(id(outer))
    if cached is None or cached[0] is not outer:
        found = {}
        # in a module, its own top-level functions are module functions, not closures
        stmts = (
            [s for s in outer.body if not isinstance(s, (cst.FunctionDef, cst.ClassDef))] if isinstance(outer, cst.Module) else [outer.body]
        )
        for stmt in stmts:
            for n in _iter_nodes_all(stmt):
                if isinstance(n, cst.FunctionDef):
                    found.setdefault(n.name.value, n)
        cached = _NESTED[id(outer)] = (outer, found)
    return cached[1]


def local_function(name: str, env: Env) -> cst.FunctionDef | None:
    """A function defined inside the calling function, or in a loop or branch of module-level code; for a
    nested function, also one its enclosing function defines (`def update(): compute_loss(data)` beside
    `def compute_loss(data): ...` in the same `def ppo(...)`)."""
    outer = env.func.node if env.func is not None and env.func.node is not None else env.module.tree
    found = nested_functions(outer).get(name)
    if found is None and outer is not env.module.tree:
        enclosing = enclosing_function(outer, env.module)
        found = nested_functions(enclosing[0]).get(name) if enclosing is not None else None
    return found


def enclosing_function(node: cst.FunctionDef, module) -> tuple[cst.FunctionDef, cst.ClassDef | None] | None:
    """The module function or method (and its class) a nested function is defined in; None for those."""
    table = _ENCLOSING.get(id(module.tree))
    if table is None or table[0] is not module.tree:
        outers = [(f, None) for f in module.functions.values()]
        outers += [(m, c) for c in module.classes.values() for m in c.body.body if isinstance(m, cst.FunctionDef)]
        found = {}
        for outer, cls in outers:
            for inner in nested_functions(outer).values():
                found.setdefault(id(inner), (outer, cls))
        table = _ENCLOSING[id(module.tree)] = (module.tree, found)
    return table[1].get(id(node))


_ENCLOSING: dict[int, tuple[cst.Module, dict]] = memo()  # module id -> (module, nested function id -> (outer, class))


def _defined_here(func: cst.BaseExpression, env: Env) -> bool:
    """A function or method whose body the analysis follows (the step is then seen inside it)."""
    module = env.module
    if module is None:
        return False
    if isinstance(func, cst.Name):
        if func.value in module.functions or func.value in module.classes:
            return True
        imported = module.imported_module(func.value)
        if imported is not None and imported[1] in imported[0].functions:
            return True
        return local_function(func.value, env) is not None
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
        cls = env.func.cls if env.func is not None else None
        return cls is not None and module.method(cls, func.attr.value) is not None
    return False


def is_step_op(node: cst.CSTNode, env: Env) -> bool:
    return isinstance(node, cst.Call) and (
        is_backward(node, env) or is_optimizer_step(node, env) or is_delegated_step(node, env) or is_manual_update(node)
    )


def is_manual_update(call: cst.Call) -> bool:
    """A hand-written optimizer update of one parameter from its own gradient: `p.data.add_(p.grad,
    alpha=-lr)`, `p.sub_(lr * p.grad)` (SGD written out, as word-level language models do)."""
    m = method_call(call)
    if m is None or m[1] not in ("add_", "sub_"):
        return False
    receiver = m[0].value if type(m[0]) is cst.Attribute and m[0].attr.value == "data" else m[0]
    if type(receiver) is not cst.Name:
        return False
    return any(
        type(n) is cst.Attribute and n.attr.value == "grad" and type(n.value) is cst.Name and n.value.value == receiver.value
        for a in call.args
        for n in _iter_nodes(a.value)
    )


def is_periodic_gpu_branch(node: cst.If, env: Env) -> bool:
    if env._tensor(node.test, 0) is True:
        return False
    for sub in _iter_nodes(node.body):
        if type(sub) is cst.Call:
            if is_step_op(sub, env):
                return False
    for sub in _iter_nodes(node.body):
        if type(sub) is cst.With and any(is_no_grad_item(i.item, env) for i in sub.items):
            return True
        m = method_call(sub)
        if m is not None and m[1] == "eval" and env.kind_of(m[0]) in (MODEL, DDP):
            return True
        if (
            type(sub) is cst.Call
            and type(sub.func) is cst.Name
            and sub.func.value.startswith(("eval", "valid", "test", "estimate", "sample", "generate"))
        ):
            return True
    return False


def _is_step_like(node: cst.CSTNode) -> bool:
    return type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value in ("backward", "step", "manual_backward")


def _mentions_no_grad(node: cst.With | cst.FunctionDef) -> bool:
    parts = [i.item for i in node.items] if isinstance(node, cst.With) else [d.decorator for d in node.decorators]
    return any(
        isinstance(n, (cst.Name, cst.Attribute))
        and (n.value if isinstance(n, cst.Name) else n.attr.value) in ("no_grad", "inference_mode", "set_grad_enabled")
        for p in parts
        for n in _iter_nodes(p)
    )


def _iter_nodes_all(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(children(n))


def _iter_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if type(n) not in _SKIP:
            stack.extend(children(n))


def iter_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    return _iter_nodes(node)


def bind_free_names(info, env: Env, outer: Env, seeds: dict[str, bool]) -> None:
    """A closure reads the enclosing function's names: they mean there what they mean here."""
    own = set(info.params) | set(info.scope.values)
    for node in _iter_nodes_all(info.node.body):
        if isinstance(node, cst.Name) and node.value not in own and node.value not in env.bound:
            env.bound[node.value] = (outer, node)
            verdict = outer._tensor(node, 0)
            if verdict is not None:
                seeds[node.value] = verdict


def returned_closure(name: str, env: Env) -> tuple[cst.FunctionDef, cst.FunctionDef, cst.Call] | None:
    """`train_step = make_train_step(model, opt)` where the module function `make_train_step` returns a
    function it defines: that inner function, its factory, and the call that built it."""
    module = env.module
    for value in env.values_of(name) if module is not None else ():
        if type(value) is cst.Call and type(value.func) is cst.Name and value.func.value in module.functions:
            factory = module.functions[value.func.value]
            inner = nested_functions(factory)
            for ret in returns(factory):
                if type(ret.value) is cst.Name and ret.value.value in inner:
                    return inner[ret.value.value], factory, value
    return None


def is_mapped_lambda(node: cst.CSTNode, ancestors: tuple[cst.CSTNode, ...]) -> bool:
    """`map(lambda x: x.to(device), batch)`: the lambda runs in the iteration, once per item."""
    call = ancestors[-2] if len(ancestors) > 1 else None
    return (
        type(node) is cst.Lambda
        and type(call) is cst.Call
        and type(call.func) is cst.Name
        and call.func.value in ("map", "filter")
        and call.args[0].value is node
    )
