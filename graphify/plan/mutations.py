"""State the loop changes outside the step that the step reads: capture would freeze it.

An attribute (`self.global_step`, `setattr`, a module's `apply`), a container (`cfg["scale"] = s`,
`temps.append(t)`) or a name a called function rebinds (`global scale`) changed in the loop outside the
step, or by a loop around it between its runs (`args.accum = 8` in the epoch loop), is read by the
captured step as it was at capture; every replay keeps that value. Plain names the loop rebinds are
the step's inputs instead (each value its own graph), and so are containers it rebinds every step.
"""

from __future__ import annotations

import libcst as cst

from graphify.analysis.containers import makes_container
from graphify.analysis.names import class_made, dotted
from graphify.analysis.tree import descendants
from graphify.analysis.vocabulary import OPTIMIZER, SCHEDULER
from graphify.analysis.statements import names_bound_by, names_read, names_written, walk
from graphify.plan.base import moved_statements
from graphify.plan.dataflow import attribute_targets, captured_nodes, target_parts
from graphify.plan.refusals import MUTATED_STATE


# methods of dicts, lists and deques that change the container in place
_MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "append", "extend", "insert", "remove", "appendleft", "extendleft"}
_ARRAY_MUTATORS = {"fill", "put", "sort", "itemset"}  # a numpy array's in-place methods (host memory a capture would freeze)


def check_loop_mutations(plan, body, refuse) -> None:
    """An attribute or item assigned in the loop outside the step must not reach the step: neither read
    by it (`self.global_step`, `cfg["scale"]`), nor under an object it hands to code graphify does not
    see (`model.drop.p = ...` while the step calls `model(x)`)."""
    region = plan.loop.region
    captured = list(captured_nodes(plan, body))
    _loop_names_read_by_calls(plan, captured, refuse)
    graph_ids = {id(n) for i in plan.graph for n in walk(body[i])}
    kept_out = {id(n) for i, split in plan.split_ifs.items() for s in moved_statements(body[i], split) for n in walk(s)}
    rebound = names_written(plan.loop.node)  # its target included
    assigned = []  # (chain in the loop's scope, node, where)
    globals_changed = []  # (module name, node, where)
    for node, site in region.nodes:
        anchors = [node] if site.block is region.body_block else region.body_calls_of(site)
        if not anchors or all(id(anchor) in graph_ids and id(anchor) not in kept_out for anchor in anchors):
            continue  # only the step reaches it
        chains = _changed_chains(node, rebound, plan.loop)
        assigned += [(_in_loop_scope(chain, site, region), node, "in the loop") for chain in chains]
        if isinstance(node, (cst.Global, cst.Nonlocal)):  # `global scale` in a function the loop calls: a name it rebinds
            globals_changed += [(n.name.value, node, "in the loop") for n in node.names]
    outer_chains, outer_names = _changed_between_runs(plan.loop, rebound)
    assigned += [(chain, node, "in an enclosing loop") for chain, node in outer_chains]
    globals_changed += [(name, node, "in an enclosing loop") for name, node in outer_names]
    if not assigned and not globals_changed:
        return
    followed = {id(b.call) for b in region.blocks if b.call is not None}
    handed, read, names = [], [], set()
    for node, site in captured:
        if isinstance(node, cst.Name):
            names.add(node.value)  # as spelled anywhere the step runs: a global reads the same everywhere
        if isinstance(node, cst.Call) and id(node) not in followed:
            exprs = [node.func, *(a.value for a in node.args)]
            if isinstance(node.func, cst.Attribute):
                exprs.append(node.func.value)
            handed += [_in_loop_scope(dotted(e), site, region) for e in exprs]
        elif isinstance(node, (cst.Attribute, cst.Name)):
            read.append(_in_loop_scope(dotted(node), site, region))
    for name, node, where in globals_changed:
        if name in names:
            refuse(MUTATED_STATE, node, f"`{name}` is rebound {where} (`global`/`nonlocal`) and read by the step; capture would freeze it")
    for chain, node, where in assigned:
        if chain is None:
            refuse(MUTATED_STATE, node, "an attribute is assigned in the loop on an object the analysis cannot follow")
        elif any(name is not None and (name == chain or name.startswith(chain + ".")) for name in read):
            refuse(MUTATED_STATE, node, f"`{chain}` is changed {where} and read by the step; capture would freeze it")
        else:
            name = next((name for name in handed if name is not None and name != "self" and chain.startswith(name + ".")), None)
            if name is not None:
                refuse(MUTATED_STATE, node, f"`{chain}` is changed {where} and the step hands `{name}` to code that may read it")


def _loop_names_read_by_calls(plan, captured: list, refuse) -> None:
    """Names the loop, or a loop around it, rebinds (`scale = 1 + i / 100`, `for epoch in ...`) that a
    function the step runs reads without binding them: a method (a forward) of a class at module level,
    or one of the module's functions, reads the module's name when the loops are at module level or the
    loop's function declares it `global`; a method of a class defined in the loop's function reads that
    function's. Plain closures read the loop's names by design and are planned as such. A capture would
    freeze the value read at capture."""
    region, loop = plan.loop.region, plan.loop
    outermost = loop.outer_loops[0] if loop.outer_loops else loop.node
    rebound = names_written(outermost)
    module_readers = {id(s) for c in loop.module.classes.values() for s in c.body.body if isinstance(s, cst.FunctionDef)}
    module_readers |= {id(f) for f in loop.module.functions.values()}
    if loop.func.node is None:
        readers = {key: rebound for key in module_readers}
    else:
        declared = {n.name.value for g in walk(loop.func.node) if isinstance(g, cst.Global) for n in g.names}
        inside = {id(n) for n in descendants(loop.func.node)}
        local = {id(s) for c in loop.module.classes.values() if id(c) in inside for s in c.body.body if isinstance(s, cst.FunctionDef)}
        # a function defined beside the loop (a loss `def` in `main`) reads `main`'s names when called: a value an
        # enclosing loop rebinds is read at capture only (one defined in the loop body is refused as a closure)
        in_loop = {id(n) for n in descendants(loop.node)}
        beside = {id(f) for f in _local_functions(loop) if f is not loop.func.node and id(f) not in in_loop}
        readers = {key: rebound & declared for key in module_readers - local} | {key: rebound for key in local | beside}
    reached = {id(site.block.func.node): site.block.func for _, site in captured if site.block is not region.body_block}
    frozen = {
        name
        for key, func in reached.items()
        for name in names_read(func.node.body) & readers.get(key, set())
        if _is_global_in(name, func.node, func.scope)
    }
    for name in sorted(frozen):
        binder = next((n for n in walk(outermost) if isinstance(n, cst.BaseSmallStatement) and name in names_written(n)), outermost)
        refuse(
            MUTATED_STATE,
            binder,
            f"`{name}` is rebound by the loop and read by a function the step runs (a forward, a loss); capture would freeze it",
        )


def _containers(node, rebound: set[str]) -> list[str]:
    """`cfg` for `cfg["scale"] = ...`: a container named by a name or an attribute chain, which the loop
    does not rebind (a batch dict made each step is an input of the step, copied in, not frozen)."""
    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
    out = []
    for part in (p for t in targets for p in target_parts(t)):
        if isinstance(part, cst.Subscript):
            chain = dotted(part.value)
            if chain is not None and chain.split(".", 1)[0] not in rebound:
                out.append(chain)
    return out


def _changed_between_runs(loop, rebound: set[str]) -> tuple[list, list]:
    """What the loops around this one change between its runs, outside it: attribute chains and
    containers (`args.accum = 8` in the epoch loop), and names that functions they call by name rebind
    in an outer scope (`decay()`, whose `global scale` rebinds `scale`)."""
    outer = loop.outer_loops
    if not outer:
        return _changed_by_callers(loop), []
    local = _local_functions(loop)
    declared = _rebound_by_functions(loop, local)
    inner = {id(n) for n in walk(loop.node)}
    chains, names = [], []
    # `for m in model.modules(): m.p = p`: what the loop variable reaches is under `model`
    under = {
        name: f"{root}.*"
        for n in walk(outer[0].body)
        if isinstance(n, cst.For) and id(n) not in inner
        for root in [dotted(n.iter.func.value if isinstance(n.iter, cst.Call) and isinstance(n.iter.func, cst.Attribute) else n.iter)]
        if root is not None
        for name in names_bound_by(n.target)
    }
    for node in walk(outer[0].body):  # the outermost loop holds the others
        if id(node) in inner:
            continue
        chains += [(under.get((chain or "").split(".")[0], chain), node) for chain in _changed_chains(node, rebound, loop)]
        if isinstance(node, cst.Call):
            chains += [(chain, node) for chain in _changed_by_call(node, loop, local)]
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
            names += [(name, node) for name in declared.get(node.func.value, ())]
    return chains + _changed_by_callers(loop), names


def _changed_by_callers(loop) -> list:
    """What loops that call the loop's function again and again change between those calls (`cfg.temp =
    1.0 + epoch` before each `evaluate(model, loader, cfg)`), spelled with the function's parameters:
    graphs of its step, found again on each call, would keep the first call's values."""
    func = loop.func.node
    if func is None:
        return []
    params = [p.name.value for p in func.params.params]
    module_names = loop.region.body_block.env.module_scope.values
    found = []
    for caller in (n for n in walk(loop.module.tree) if isinstance(n, (cst.For, cst.While)) and n is not loop.node):
        calls = [c for c in walk(caller.body) if isinstance(c, cst.Call) and _calls_function(c, func)]
        if not calls:
            continue
        receiver = "self" if isinstance(calls[0].func, cst.Attribute) else None
        bound = {arg: param for param, arg in _arguments(calls[0], func, receiver).items() if arg}
        inside = {id(n) for c in calls for n in walk(c)}
        for node in walk(caller.body):
            if id(node) in inside:
                continue
            for chain in _changed_chains(node, set(), loop):
                root, _, rest = (chain or "").partition(".")
                if root in bound:
                    found.append((f"{bound[root]}.{rest}" if rest else bound[root], node))
                elif chain and root in module_names and root not in params:  # a module-level object it reads
                    found.append((chain, node))
    return found


def _calls_function(call: cst.Call, func: cst.FunctionDef) -> bool:
    """`evaluate(...)` or `self.evaluate(...)` for `def evaluate`."""
    name = func.name.value
    return (isinstance(call.func, cst.Name) and call.func.value == name) or (
        isinstance(call.func, cst.Attribute) and call.func.attr.value == name and dotted(call.func.value) == "self"
    )


def _changed_by_call(call: cst.Call, loop, local: list[cst.FunctionDef]) -> list[str]:
    """What a function or method of this file, called between runs, changes in place, spelled with the
    caller's names: `self`'s attributes as the receiver's (`temperature.step()` sets `temperature.T`),
    a parameter's as its argument's (`update_cfg(cfg, e)`: `cfg.aux_weight`), and anything else it
    changes (`for m in model.modules(): m.p = p`) as under every object handed to it."""
    callee, receiver = _callee(call, loop, local)
    if callee is None:
        return []
    # containers it makes itself (`images = []`) are its own; the optimizer's settings the runtime follows
    made = {t for n in walk(callee.body) if isinstance(n, cst.Assign) and makes_container(n.value) for t in names_written(n)}
    changed = [c for node in walk(callee.body) for c in _changed_chains(node, set(), loop) if (c or "").split(".")[0] not in made]
    env = loop.region.body_block.env
    if not changed or any(env.kind_of(a.value) in (OPTIMIZER, SCHEDULER) for a in call.args):
        return []
    bound = _arguments(call, callee, receiver)
    handed = [name for name in bound.values() if name is not None]
    out = []
    for chain in changed:
        root, _, rest = (chain or "").partition(".")
        if bound.get(root):
            out.append(f"{bound[root]}.{rest or '*'}")
        else:  # a module-level name it changes is spelled the same; a local one may be under what it was handed
            out += [f"{name}.*" for name in handed] + ([chain] if chain else [])
    return out


def _arguments(call: cst.Call, func: cst.FunctionDef, receiver: str | None) -> dict[str, str | None]:
    """Parameter -> the caller's name for what the call hands it (None for an expression): positional and
    keyword arguments, and `self` -> the receiver of a method call."""
    params = [p.name.value for p in func.params.params]
    method = receiver is not None and params[:1] == ["self"]
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    bound = {name: dotted(arg) for name, arg in zip(params[1:] if method else params, positional)}
    bound.update({a.keyword.value: dotted(a.value) for a in call.args if a.keyword is not None})
    if method:
        bound["self"] = receiver
    return bound


def _callee(call: cst.Call, loop, local: list[cst.FunctionDef]) -> tuple[cst.FunctionDef | None, str | None]:
    """The function (and the receiver's name, for a method) a call of this file's code runs: a module
    function, one defined in the loop's function, or a method of an object made from a class of the file."""
    module = loop.module
    if isinstance(call.func, cst.Name):
        found = [f for f in local if f.name.value == call.func.value] or [module.functions.get(call.func.value)]
        return found[0], None
    receiver = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
    env = loop.region.body_block.env
    if receiver is None or "." in receiver:
        return None, None
    classes = {class_made(v, module.classes) for v in env.values_of(receiver)} - {None}
    if len(classes) != 1:
        return None, None
    return module.method(module.classes[classes.pop()], call.func.attr.value), receiver


def _local_functions(loop) -> list[cst.FunctionDef]:
    """The functions defined in the loop's function (itself included); none for a module-level loop."""
    return [f for f in walk(loop.func.node) if isinstance(f, cst.FunctionDef)] if loop.func.node is not None else []


def _rebound_by_functions(loop, local: list[cst.FunctionDef]) -> dict[str, list[str]]:
    """Function name -> the names it declares `global` or `nonlocal`: the file's functions, and those
    defined in the loop's own function (a `def decay()` beside the loop)."""
    declared: dict[str, list[str]] = {}
    for f in [*loop.module.functions.values(), *local]:
        names = [n.name.value for g in walk(f) if isinstance(g, (cst.Global, cst.Nonlocal)) for n in g.names]
        declared.setdefault(f.name.value, []).extend(names)
    return declared


def _changed_chains(node, rebound: set[str], loop) -> list[str]:
    """What a statement or call changes in place: attributes it assigns (`args.accum = 8`, `setattr`),
    containers whose item it assigns (`cfg["scale"] = s`), containers a mutating method changes
    (`weights.update(aux=s)`, `temps.append(t)`), and anything under a module `apply` visits (`net.*`)."""
    if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
        return [dotted(t) for t in attribute_targets(node)] + _containers(node, rebound)
    if not isinstance(node, cst.Call):
        return []
    if isinstance(node.func, cst.Attribute) and node.func.attr.value in _MUTATORS | _ARRAY_MUTATORS:
        receiver = node.func.value
        if isinstance(receiver, cst.Name) and receiver.value not in rebound and _plain_container(receiver.value, loop):
            return [receiver.value]
        chain = dotted(receiver) if isinstance(receiver, cst.Attribute) else None
        if chain is not None and chain.split(".", 1)[0] not in rebound and _container_attribute(chain, loop):
            return [chain]  # `model.history.append(i)`: a list the model's class made
    if isinstance(node.func, cst.Attribute) and node.func.attr.value == "apply":  # `model.apply(set_dropout)`
        chain = dotted(node.func.value)
        return [f"{chain}.*"] if chain is not None else []
    if dotted(node.func) in ("setattr", "delattr") and node.args:  # `setattr(model.drop, "p", p)`
        chain = dotted(node.args[0].value)
        name = node.args[1].value if len(node.args) > 1 else None
        attr = name.evaluated_value if isinstance(name, cst.SimpleString) else "*"
        return [f"{chain}.{attr}"] if chain is not None else []
    return []


def _plain_container(name: str, loop) -> bool:
    """A name only ever bound to a dict, list or deque (a literal or its constructor) or a numpy array
    made by numpy: its `update`, `append` or `fill` changes values the step may read. Other objects'
    `update()` (a GradScaler's, a meter's) is their own business, judged by the rules that know them."""
    values = loop.func.scope.values.get(name) or loop.module.scope.values.get(name)
    return bool(values) and all(
        makes_container(v) or (isinstance(v, cst.Call) and (dotted(v.func) or "").split(".", 1)[0] in ("np", "numpy")) for v in values
    )


def _container_attribute(chain: str, loop) -> bool:
    """`model.history` where `model` is made from a class of the file (`Net()`, `Net().cuda()`) whose
    methods bind `self.history` only to a dict, list or deque: a container its in-place methods change."""
    root, _, attr = chain.partition(".")
    if "." in attr:
        return False
    values = loop.func.scope.values.get(root) or loop.module.scope.values.get(root) or []
    classes = {class_made(value, loop.module.classes) for value in values}
    if not classes or None in classes:
        return False
    bound = [
        n.value
        for name in classes
        for n in descendants(loop.module.classes[name])
        if isinstance(n, cst.Assign) and any(isinstance(t.target, cst.Attribute) and dotted(t.target) == f"self.{attr}" for t in n.targets)
    ]
    return bool(bound) and all(makes_container(v) for v in bound)


def _in_loop_scope(chain: str | None, site, region) -> str | None:
    """An attribute chain of a called function, spelled in the loop's scope (parameters traced to their
    call-site argument, `self` to the receiver of the call); None when it cannot be."""
    block = site.block
    while chain is not None and block is not region.body_block:
        root, _, rest = chain.partition(".")
        call = block.call
        if root in block.env.bound:
            arg = dotted(block.env.bound[root][1])
        elif root == "self" and call is not None:
            # `obj.method()` binds self to obj; `model(x)` (a forward) binds it to model
            arg = (
                dotted(call.func.value)
                if isinstance(call.func, cst.Attribute) and block.func.node is not None and block.func.node.name.value != "forward"
                else dotted(call.func)
            )
        elif _is_global_in(root, block.func.node, block.func.scope):
            return chain  # a module's name (`gains[0]` read in a forward): the loop's scope spells it the same
        else:
            return None
        chain = f"{arg}.{rest}" if arg and rest else arg
        block = block.parent
    return chain


def _is_global_in(name: str, func: cst.FunctionDef | None, scope) -> bool:
    """The function neither takes nor binds `name`: it reads the module's (or an enclosing function's)."""
    if func is None or name in scope.values:
        return False
    params = func.params
    taken = [*params.posonly_params, *params.params, *params.kwonly_params, params.star_arg, params.star_kwarg]
    return name not in {p.name.value for p in taken if isinstance(p, cst.Param)}
