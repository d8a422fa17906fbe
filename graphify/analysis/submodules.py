"""Which modules of the checked code a call of a container of modules runs.

`self.main(x)` where `self.main = nn.Sequential(nn.Linear(8, 8), Norm(), nn.ReLU())` runs `Norm.forward`;
`for layer in self.layers: x = layer(x)` over `nn.ModuleList([Down(), Mid(), Up()])` runs each of theirs;
`for module in self: x = module(x)` in an `nn.Sequential` subclass runs the forward of every module its
constructions and its subclasses' `super().__init__(...)` hand it. The analysis reads each of them, as
it reads the forward of a module called by name.
"""

from __future__ import annotations

import libcst as cst

from graphify.analysis.names import class_made, dotted
from graphify.analysis.tree import descendants, memo
from graphify.analysis.values import Env

MODULE_CONTAINERS = ("ModuleList", "Sequential", "ModuleDict")


def module_classes_called(func: cst.BaseExpression, env: Env) -> list[cst.ClassDef]:
    """The classes of this file whose forward a call of `func` may run, in the order their modules were
    made; empty when `func` is no container of modules, nor an item of one."""
    name = dotted(func)
    if name is None or env.module is None:
        return []
    containers = [v for v in env.values_of(name) if container_items(v, env)]
    items_of_self = False
    if "." not in name:  # `for layer in self.layers: layer(x)`, `for module in self: module(x)`
        for iterable in iterables_binding(name, env):
            if dotted(iterable) == "self":
                items_of_self = True
            elif dotted(iterable) is not None:
                containers += [v for v in env.values_of(dotted(iterable)) if container_items(v, env)]
            else:
                containers.append(iterable)
    items = [item for c in containers for item in container_items(c, env)]
    if items_of_self and env.func is not None and env.func.cls is not None:
        items += _items_handed_to(env.func.cls, env)
    found: list[cst.ClassDef] = []
    for item in items:
        made = class_made(item, env.module.classes)
        cls = env.module.classes.get(made) if made else None
        if cls is not None and all(cls is not f for f in found):
            found.append(cls)
    return found


def _items_handed_to(cls: cst.ClassDef, env: Env) -> list[cst.BaseExpression]:
    """The modules a container class of this file holds: the arguments of its constructions, and of the
    `super().__init__(...)` calls of it and of its subclasses (`FlowStep(FlowSequential)` handing
    `Actnorm(...), Conv(...)` to its base)."""
    module = env.module
    if not _is_container_class(cls, module.classes):
        return []
    family = {c.name.value for c in module.classes.values() if _derives_from(c, cls, module.classes)}
    items = []
    for c in module.classes.values():
        if c.name.value not in family:
            continue
        for n in descendants(c):
            if type(n) is cst.Call and _is_super_init(n):
                items += _arguments(n, env)
    for n in descendants(module.tree):
        if type(n) is cst.Call and type(n.func) is cst.Name and n.func.value == cls.name.value:
            items += _arguments(n, env)
    return items


def _arguments(call: cst.Call, env: Env) -> list[cst.BaseExpression]:
    return [item for a in call.args if a.keyword is None for item in (container_items(a.value, env) if a.star else [a.value])]


def _is_super_init(call: cst.Call) -> bool:
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value == "__init__"
        and isinstance(func.value, cst.Call)
        and dotted(func.value.func) == "super"
    )


def _is_container_class(cls: cst.ClassDef, classes: dict, depth: int = 0) -> bool:
    for base in cls.bases:
        name = dotted(base.value) or ""
        if name.endswith(MODULE_CONTAINERS):
            return True
        if name in classes and classes[name] is not cls and depth < 8 and _is_container_class(classes[name], classes, depth + 1):
            return True
    return False


def _derives_from(cls: cst.ClassDef, base: cst.ClassDef, classes: dict, depth: int = 0) -> bool:
    if cls is base:
        return True
    parents = [classes.get(dotted(b.value) or "") for b in cls.bases]
    return depth < 8 and any(p is not None and p is not cls and _derives_from(p, base, classes, depth + 1) for p in parents)


def iterates_submodules(loop: cst.For | cst.While, env: Env) -> bool:
    """`for module in self:`, `for layer in self.layers:` (an nn.ModuleList): a forward pass through a
    model's layers, not a loop of steps."""
    if not isinstance(loop, cst.For):
        return False
    name = dotted(item_and_container(loop)[1]) or ""
    if name == "self":
        return True
    made = [v for v in env.values_of(name) if isinstance(v, cst.Call)] if name.startswith("self.") else []
    return bool(made) and all((env.qualify(v.func) or "").endswith(MODULE_CONTAINERS) for v in made)


def iterables_binding(name: str, env: Env) -> list[cst.BaseExpression]:
    """What `for name in ...` loops of the function iterate (through `enumerate` and `reversed`)."""
    body = getattr(env.func, "node", None)
    if body is None:
        return []
    found = _LOOP_ITEMS.get(id(body))
    if found is None or found[0] is not body:
        items: dict[str, list[cst.BaseExpression]] = {}
        for loop in (n for n in descendants(body) if isinstance(n, cst.For)):
            target, it = item_and_container(loop)
            if isinstance(target, cst.Name):
                items.setdefault(target.value, []).append(it)
        found = _LOOP_ITEMS[id(body)] = (body, items)
    return found[1].get(name, [])


_LOOP_ITEMS: dict[int, tuple[cst.FunctionDef, dict]] = memo()  # function id -> (function, loop item name -> iterables)


def item_and_container(loop: cst.For) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """What a `for` binds to each item, and what it takes the items from, through `enumerate` and
    `reversed`: (`layer`, `self.layers`) for `for i, layer in enumerate(self.layers)`."""
    target, it = loop.target, loop.iter
    while isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value in ("enumerate", "reversed") and it.args:
        if it.func.value == "enumerate" and isinstance(target, cst.Tuple) and len(target.elements) == 2:
            target = target.elements[1].value
        it = it.args[0].value
    return target, it


def container_items(value: cst.BaseExpression, env: Env) -> list[cst.BaseExpression]:
    """The items a container of modules is built from: `[A(), B()]`, `[Block(...) for ...]`,
    `nn.Sequential(A(), *[B() for ...])`, `nn.ModuleList([...])`."""
    if isinstance(value, (cst.List, cst.Tuple)):
        return [e.value for e in value.elements]
    if isinstance(value, cst.ListComp):
        return [value.elt]
    if isinstance(value, cst.Call) and (env.qualify(value.func) or "").endswith(MODULE_CONTAINERS) and value.args:
        if len(value.args) == 1 and not value.args[0].star:
            return container_items(value.args[0].value, env)
        return [item for a in value.args for item in (container_items(a.value, env) if a.star else [a.value])]
    return []
