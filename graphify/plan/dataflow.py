"""The dataflow rule for what may enter a captured step (docs/heuristics.md, "What the captured step
may read").

Capture runs the step's Python once; replays rerun only its GPU work. So every value the captured
statements read must be a static input (a tensor re-bound each step and copied in before replay),
device state that lives across steps (parameters, buffers, optimizer state), or constant for the
whole loop. Python values that change between steps, calls with host side effects, and attributes
or modes changed in the loop would be frozen at capture: the loop is refused with a GFY7xx code.
Statements moved out of the step keep their order with respect to everything they may affect.
"""

from __future__ import annotations

import libcst as cst

from graphify.analysis.checker import code_of
from graphify.analysis.logging_calls import is_logging_call
from graphify.analysis.containers import makes_container
from graphify.analysis.region import Site
from graphify.analysis.names import code_text, dotted
from graphify.analysis.randomness import DEVICE_RANDOM, RANDOM_FACTORIES
from graphify.analysis.statements import is_host_read_call, names_read, names_written, walk
from graphify.analysis.tree import children
from graphify.analysis.vocabulary import DDP, HOST_CLOCKS, MODEL, OPTIMIZER, PURE_BUILTINS, SCALER, SYNC_FLAG
from graphify.plan.base import moved_statements
from graphify.plan.refusals import HOST_SIDE_EFFECT, LOOP_SHAPE, MUTATED_STATE, ORDER

# Calls whose effect lives on the host: capture runs them once, replays never.
_IMPURE_PREFIXES = ("random.", "numpy.random.", "time.", "os.", "sys.", "datetime.", "secrets.", "uuid.", "pickle.", "json.", "shutil.")
_IMPURE_BUILTINS = {"next", "input", "open", "exec", "eval", "setattr", "delattr", "breakpoint", "iter"}
_MODE_METHODS = {
    "train",
    "eval",
    "requires_grad_",
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_backward_hook",
    "apply",
}
# Calls that only read host values: moving them out of the step does not change what the step computes.
_MOVABLE_BUILTINS = PURE_BUILTINS | {"print"}
# Methods that return a new value and change nothing, whatever their receiver (tensors, arrays).
_PURE_METHODS = {
    "astype",
    "pin_memory",
    "to",
    "cuda",
    "cpu",
    "float",
    "half",
    "bfloat16",
    "long",
    "int",
    "bool",
    "view",
    "reshape",
    "contiguous",
    "clone",
    "detach",
    "numpy",
    "tolist",
    "item",
    "split",
    "chunk",
    "unsqueeze",
    "squeeze",
    "permute",
    "transpose",
    "flatten",
    "copy",
    "get",
    "keys",
    "values",
    "items",
    "format",
}
_COLLECTING = {"append", "extend", "add", "update", "setdefault"}


def captured_nodes(plan, body):
    """(node, site) for every node the captured statements run, called functions included."""
    region = plan.loop.region
    graph_ids = {id(n) for i in plan.graph for n in walk(body[i])}
    here = Site(region.body_block, ())
    for i in plan.graph:
        roots = plan.hoisted[i].captured_roots(body[i]) if i in plan.hoisted else [body[i]]
        kept_out = {id(s) for s in moved_statements(body[i], plan.split_ifs[i])} if i in plan.split_ifs else set()
        kept_out |= set(plan.draws)
        for n in (n for root in roots for n in _walk_except(root, kept_out)):
            yield n, here
    for node, site in region.nodes:
        if site.block is not region.body_block and any(id(call) in graph_ids for call in region.body_calls_of(site)):
            yield node, site


def _walk_except(root, skipped: set[int]):
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in skipped:
            continue
        yield n
        if not isinstance(n, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) or n is root:
            stack.extend(reversed(list(n.children)))


def check_captured_code(plan, body, refuse) -> None:
    """Host side effects and state changes inside the captured step; bindings it cannot follow; parameters
    frozen where a gradient-accumulation step keeps its gradients zeroed rather than unset."""
    if plan.zero_grads and _freezes_parameters(plan):
        refuse(
            MUTATED_STATE,
            plan.zero_grads[0],
            "parameters are frozen or unfrozen (`requires_grad`) where this loop runs; the accumulation step keeps gradients"
            " zeroed, not unset (set_to_none=False), so the optimizer would keep moving a frozen parameter eager leaves alone",
        )
    for node in (n for stmt in body for n in walk(stmt) if isinstance(n, cst.NamedExpr)):
        refuse(LOOP_SHAPE, node, "an assignment expression (`:=`) binds a name inside an expression of the loop body")
    for i in plan.graph:  # `return model(x)` / `yield ...` in an inference loop: the step would leave itself
        exit_ = exit_of(body[i])
        if exit_:
            refuse(ORDER, body[i], f"a captured statement can `{exit_}`: the step function would do it, not the loop's")
    made_in_step = set().union(*(names_written(body[i]) for i in plan.graph))
    for node, site in captured_nodes(plan, body):
        env = site.env
        if isinstance(node, cst.Call):
            qual = env.qualify(node.func) or dotted(node.func) or ""
            if qual in _IMPURE_BUILTINS or qual.startswith(_IMPURE_PREFIXES):
                refuse(HOST_SIDE_EFFECT, node, f"the step calls `{qual}`, a host side effect that capture would run only once")
            method = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
            # `t.requires_grad_()` on a tensor only marks it for autograd, which capture records like any other op
            receiver = node.func.value if method == "requires_grad_" else None
            on_tensor = receiver is not None and env.kind_of(receiver) not in (MODEL, DDP) and env.is_tensor(receiver)
            if method in _MODE_METHODS and not _is_torch_namespace(node.func, env) and not on_tensor and not _replayed_mode_call(node, env):
                refuse(MUTATED_STATE, node, f"the step calls `.{method}()`, which changes module state that replays would not")
            if (
                method in _COLLECTING | _REMOVING
                and site.block is plan.loop.region.body_block
                and _outer_container(node.func.value, env, made_in_step)
            ):
                refuse(
                    MUTATED_STATE, node, f"the step adds to `{dotted(node.func.value)}` (`.{method}()`) at capture only: replays would not"
                )
            if method in _COLLECTING | _REMOVING and site.block.call is not None and _outer_receiver(node.func.value, site):
                refuse(
                    MUTATED_STATE,
                    node,
                    f"a function the step calls changes `{dotted(node.func.value)}` (`.{method}()`), which replays would not",
                )
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            refuse(MUTATED_STATE, node, "the step rebinds a variable outside its own scope (`global`/`nonlocal`)")
        elif isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            for t in attribute_targets(node):
                if t.attr.value == SYNC_FLAG:
                    continue  # DDP's sync switch: GFY612 says whether it is set alike on every step
                if isinstance(node, cst.AugAssign) and env.is_tensor(t):
                    continue  # `self.initialized += 1` on a buffer: an in-place op on the device, which replays repeat
                if _unsets_gradient(node, t) and not plan.keys:
                    continue  # `p.grad = None`: zero_grad(set_to_none=True) by hand, the backward captured after it writes anew
                refuse(MUTATED_STATE, node, f"the step assigns `{dotted(t) or 'an attribute'}`, a host state change replays would not make")


def _unsets_gradient(node: cst.CSTNode, target: cst.Attribute) -> bool:
    """`param.grad = None`: what `zero_grad(set_to_none=True)` does to each parameter. Captured, the backward
    after it writes fresh gradients at capture and the same tensors at every replay, as eager's backward
    writes new ones. A step keyed on a host condition shares its gradients between graphs: there they are
    zeroed, never unset (emit's set_to_none=False), which an assignment cannot be turned into."""
    return isinstance(node, cst.Assign) and target.attr.value == "grad" and isinstance(node.value, cst.Name) and node.value.value == "None"


def _replayed_mode_call(call: cst.Call, env) -> bool:
    """`model.train()`, `teacher.eval()`, `net.train(False)` on a model the step runs: the mode is part of each
    graph's key, and CapturedStep sets after each replay the modes the step's own calls set at capture."""
    method = call.func.attr.value
    constant = not call.args or (method == "train" and len(call.args) == 1 and dotted(call.args[0].value) in ("True", "False"))
    return method in ("train", "eval") and constant and env.kind_of(call.func.value) in (MODEL, DDP)


def _freezes_parameters(plan) -> bool:
    """`p.requires_grad_(False)` or `p.requires_grad = False` in the loop's function (or module)."""
    scope = plan.loop.func.node if plan.loop.func.node is not None else plan.loop.module.tree
    for n in walk(scope):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "requires_grad_":
            return True
        if isinstance(n, (cst.Assign, cst.AugAssign)) and any(t.attr.value == "requires_grad" for t in attribute_targets(n)):
            return True
    return False


def _is_torch_namespace(func: cst.BaseExpression, env) -> bool:
    return (env.qualify(func) or "").startswith("torch.")


def target_parts(target):
    if isinstance(target, (cst.Tuple, cst.List)):
        for el in target.elements:
            yield from target_parts(el.value)
    elif isinstance(target, cst.StarredElement):
        yield from target_parts(target.value)
    else:
        yield target


def attribute_targets(node):
    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
    return [t for target in targets for t in target_parts(target) if isinstance(t, cst.Attribute)]


_REMOVING = {"pop", "remove", "clear", "insert", "popleft", "appendleft"}


def _outer_container(receiver: cst.BaseExpression, env, made_in_step: set[str]) -> bool:
    """A list, dict, set or deque the loop body's captured statements fill (`preds.append(model(x))`) but
    did not make: capture runs the call once, and replays add nothing."""
    name = receiver.value if isinstance(receiver, cst.Name) else None
    if name is None or name in made_in_step:
        return False
    return any(makes_container(value) for value in env.values_of(name))


def _outer_receiver(receiver: cst.BaseExpression, site: Site) -> bool:
    """A container a called function changes that it did not make itself: an argument, a global or an
    attribute. Capture runs the function once; its own lists (the one `accuracy()` fills and returns)
    live only in that run, but a change to anything else would not be repeated by replays."""
    root = (dotted(receiver) or "").split(".")[0]
    if not root or site.env.is_tensor(receiver):
        return False
    return isinstance(receiver, cst.Attribute) or root not in set().union(*(names_written(s) for s in site.block.stmts))


def check_moved_statement(plan, body, index: int, refuse) -> None:
    """A statement moved out of the step while captured statements follow it (it now runs after them)
    must not affect them nor be affected by them: host reads, logging, collecting into lists the step
    does not read, tensor work on the host's random generator, and analysed functions made of those."""
    if not any(i > index for i in plan.graph):
        return
    exit_ = exit_of(body[index])
    if exit_ is not None:
        return refuse(
            ORDER, body[index], f"it can `{exit_}` before the captured statements after it run; after the whole step, they would have run"
        )
    region = plan.loop.region
    later = set().union(*(names_read(body[i]) for i in plan.graph if i > index))
    later_ids = {id(n) for i in plan.graph if i > index for n in walk(body[i])}
    followed = {id(b.call) for b in region.blocks if b.call is not None}
    inside = {id(n) for n in walk(body[index])}
    here = Site(region.body_block, ())
    nodes = [(n, here) for n in walk(body[index])]
    nodes += [
        (n, site)
        for n, site in region.nodes
        if site.block is not region.body_block and any(id(call) in inside for call in region.body_calls_of(site))
    ]
    # names the later captured statements read, in the loop body and in the functions they call
    later |= {
        n.value
        for n, site in region.nodes
        if type(n) is cst.Name and site.block is not region.body_block and any(id(c) in later_ids for c in region.body_calls_of(site))
    }
    for n, site in nodes:
        why = _moved_effect(n, site, later, followed)
        if why:
            return refuse(ORDER, body[index], f"{why}; it sits between captured statements and cannot run after the whole step")
    changer = next((c for i in plan.graph if i > index for c in walk(body[i]) if _changes_parameters(c, here.env)), None)
    read = changer is not None and next((n for n in walk(body[index]) if _reads_parameters(n, here.env)), None)
    if read:
        why = f"it reads `{code_of(read)}`, which `{code_of(changer)}` after it changes in place"
        return refuse(ORDER, body[index], f"{why}; after the whole step it would read the changed values")


_PARAMETER_CHANGERS = {"step", "zero_grad", "backward", "clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"}


def _changes_parameters(n, env) -> bool:
    """A call that changes parameters, gradients or optimizer state in place: an optimizer's or scaler's
    step, a scaler's update, a backward, zeroing or clipping gradients, a tensor method ending in `_`."""
    if not isinstance(n, cst.Call):
        return False
    name = (env.qualify(n.func) or dotted(n.func) or "").rsplit(".", 1)[-1]
    on = env.kind_of(n.func.value) if isinstance(n.func, cst.Attribute) else None
    return (
        name in _PARAMETER_CHANGERS
        or (name == "update" and on == SCALER)
        or (isinstance(n.func, cst.Attribute) and name.endswith("_") and name[0] != "_")
    )


def _reads_parameters(n, env) -> bool:
    """A read of what those change: a `.grad`, a model's parameters or attribute, optimizer state, a scaler's scale."""
    if isinstance(n, cst.Attribute):
        owner = env.kind_of(n.value) if isinstance(n.value, cst.Name) else None
        return n.attr.value == "grad" or owner in (MODEL, DDP) or (n.attr.value == "state" and owner == OPTIMIZER)
    name = n.func.attr.value if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) else None
    return name in ("parameters", "named_parameters", "state_dict") or (name == "get_scale" and env.kind_of(n.func.value) == SCALER)


def check_hoisted_exits(plan, body, refuse) -> None:
    """A statement run before the step that can leave the iteration would skip captured statements
    that, in the source, ran before it."""
    for i in plan.before:
        exit_ = exit_of(body[i])
        if exit_ and any(g < i for g in plan.graph):
            refuse(ORDER, body[i], f"it can `{exit_}` after captured statements before it; before the whole step, they would not run")


_EXITS = {cst.Break: "break", cst.Continue: "continue", cst.Return: "return", cst.Raise: "raise", cst.Yield: "yield", cst.Await: "await"}


def exit_of(node: cst.CSTNode, in_loop: bool = False, in_def: bool = False) -> str | None:
    """The way a statement can leave the iteration (or the function) early: a break or continue of
    this loop (not of a loop nested in the statement), a return, yield or await of this function
    (not of a function defined in it), a raise."""
    kind = type(node)
    leaves_loop = kind in (cst.Break, cst.Continue)
    if kind in _EXITS and not (in_loop if leaves_loop else in_def):
        return _EXITS[kind]
    nested_loop = in_loop or isinstance(node, (cst.For, cst.While))
    nested_def = in_def or isinstance(node, (cst.FunctionDef, cst.Lambda))
    for child in children(node):
        found = exit_of(child, nested_loop, nested_def)
        if found:
            return found
    return None


def _moved_effect(n, site, later: set[str], followed: set[int]) -> str | None:
    env = site.env
    if isinstance(n, (cst.Global, cst.Nonlocal)):
        return "it rebinds a variable outside its scope"
    if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
        owners = {_owner_in_loop_body(t, site) for t in attribute_targets(n)}
        if None in owners or owners & later:
            return "it assigns an attribute"
        return None  # host bookkeeping on an object the rest of the step never reads (a meter's sums)
    if not isinstance(n, cst.Call) or id(n) in followed or is_host_read_call(n, env) or is_logging_call(n, env):
        return None
    code = code_text(n.func)
    if isinstance(n.func, cst.Name) and n.func.value in _MOVABLE_BUILTINS:
        return None
    qual = env.qualify(n.func) or ""
    if qual in HOST_CLOCKS:
        return None
    if qual.startswith("torch.") and qual.split(".")[-1] in _PROCESS_STATE:
        return f"`{code}` changes what the step runs under (grad mode, random seeds, defaults)"
    if qual.split(".")[-1] in DEVICE_RANDOM or (qual.startswith("torch.") and qual.split(".")[-1] in RANDOM_FACTORIES and _on_device(n)):
        return f"`{code}` draws from the device's random generator, whose order the step shares"
    if qual.startswith("torch.") or (qual.startswith("numpy.") and not qual.startswith("numpy.random.")):
        return None
    if isinstance(n.func, cst.Attribute):
        method, root = n.func.attr.value, (dotted(n.func.value) or "").split(".")[0]
        if method in _COLLECTING and root and root not in later:
            return None
        if method in _PURE_METHODS or (env.is_tensor(n.func.value) and not method.endswith("_")):
            return None
    return f"`{code}(...)` may change state the step uses"


def _owner_in_loop_body(target: cst.Attribute, site) -> str | None:
    """The loop body's name for the object an attribute assignment changes: `top` for `self.sum += v` in
    `AverageMeter.update`, called as `top.update(...)`; None when it cannot be told (a module-level object,
    an object a function builds or receives)."""
    root, block = (dotted(target.value) or "").split(".")[0], site.block
    while block.call is not None:
        if root != "self" or not isinstance(block.call.func, cst.Attribute):
            return None
        root = (dotted(block.call.func.value) or "").split(".")[0]
        block = block.parent
    known = root in block.env.scope.values or root in block.env.bound
    return root if root and known else None


_PROCESS_STATE = {"set_grad_enabled", "manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state", "set_rng_state_all"}
_PROCESS_STATE |= {"set_default_dtype", "set_default_device", "use_deterministic_algorithms", "set_autocast_enabled"}


def _on_device(call: cst.Call) -> bool:
    return any(a.keyword is not None and a.keyword.value in ("device", "generator") for a in call.args)


_HOST_FUNCTIONS = {"min", "max", "float", "int", "abs", "round", "len", "bool", "sum", "pow"}


def is_host_expression(expr: cst.BaseExpression, env, seen: frozenset = frozenset()) -> bool:
    """Whether an expression is known to hold a Python number or flag (never a tensor): literals,
    host names, counters (`step += 1`), and arithmetic or `min`/`max`/`math.*` over those."""
    if isinstance(expr, cst.Name):
        return is_host_name(expr.value, env, seen)
    if len(seen) > 8:
        return False
    verdict = env._tensor(expr, 0)
    if verdict is not None:
        return verdict is False
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.BinaryOperation):
        return is_host_expression(expr.left, env, seen) and is_host_expression(expr.right, env, seen)
    if isinstance(expr, cst.UnaryOperation):
        return is_host_expression(expr.expression, env, seen)
    if isinstance(expr, cst.Call):
        qual = env.qualify(expr.func) or ""
        if qual in _HOST_FUNCTIONS or qual.startswith("math."):
            return all(is_host_expression(a.value, env, seen) for a in expr.args)
    return False


def is_host_name(name: str, env, seen: frozenset = frozenset()) -> bool:
    """Whether a name is known to hold a Python number or flag, as is_host_expression says of it."""
    if len(seen) > 8:
        return False
    verdict = env.name_tensor(name)
    if verdict is not None:
        return verdict is False
    if name in seen:
        return True  # `step = step + 1`: a counter is as host as what it starts from
    inner = seen | {name}
    values = env.values_of(name)
    sources = [is_host_expression(v, env, inner) for v in values]
    if name in env.bound:
        caller_env, arg = env.bound[name]
        sources.append(is_host_expression(arg, caller_env, inner))
    elif not values and _default(env, name) is not None:
        sources.append(is_host_expression(_default(env, name), env, inner))
    return bool(sources) and all(sources)


def _default(env, name: str) -> cst.BaseExpression | None:
    """The default value of a parameter of the function the environment belongs to."""
    func = getattr(env.func, "node", None)
    if not isinstance(func, cst.FunctionDef):
        return None
    for param in (*func.params.params, *func.params.kwonly_params):
        if param.name.value == name:
            return param.default
    return None
