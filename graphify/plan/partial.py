"""Partial capture: only the model's forward and backward replay from CUDA graphs."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from graphify.analysis.calls import is_backward, is_delegated_step, is_model_call, is_no_grad_item, method_call
from graphify.analysis.discovery import bind_arguments, passed_arguments
from graphify.analysis.names import dotted
from graphify.analysis.region import Loop
from graphify.analysis.statements import names_written, unguarded, walk
from graphify.analysis.vocabulary import DDP, MODEL
from graphify.model import Partial, Rule
from graphify.plan.base import body_of
from graphify.plan.dataflow import attribute_targets, is_host_expression
from graphify.plan.refusals import DDP_MODEL, LOOP_SHAPE, MUTATED_STATE, Refusal

# What the eager code around the graphed models may not do, each rule's fix descriptor says (Rule.fix.partial):
# change attributes or modes the graphed forward may read (items written into an array the loop's function
# made, and the forward does not read, are the eager code's own: a replay buffer), or load batches padded to
# their own length. Padding from the loader changes every input's shape every batch, so a graph would rarely
# replay (padding in the loop body pads what it is given: the models fed other tensors may pay); LBFGS
# re-evaluates its closure, and a graphed model in it, under host logic of its own. Collectives around the
# models run eagerly where they stand; whether a model is wrapped in DDP only the run can tell, and
# GraphedModule leaves such a model eager.


@dataclass
class PartialPlan:
    loop: Loop
    model_calls: list[cst.Call]  # `model(x)` with grad: each becomes a call of its model's graphed module
    models: list[str]  # the models called (`model`, `self.model`), in the order they appear in the loop body
    reasons: list[str]  # why the whole step cannot be captured
    model_passes: list[cst.BaseExpression]  # `model` handed to a helper that calls it: the graphed module instead


def make_partial_plan(loop: Loop, reasons: list[str], breakers: list[tuple[Rule, cst.CSTNode | None]]) -> PartialPlan:
    """A plan to graph only the model's forward and backward, for a training loop whose whole step
    cannot be captured. `breakers`: every finding and planner refusal of the loop, (rule, node). Those
    outside the model's forward stay eager where they stand; one inside it blocks."""
    if loop.kind != "train" or loop.node.orelse is not None:
        raise Refusal(LOOP_SHAPE, "partial capture is for training loops")
    body = unguarded(body_of(loop))
    env = loop.region.body_block.env
    calls = [n for s in body for n in walk(s) if isinstance(n, cst.Call)]
    without_grad = {
        id(n)
        for s in body
        for w in walk(s)
        if isinstance(w, cst.With) and any(is_no_grad_item(i.item, env) for i in w.items)
        for n in walk(w)
    }
    scope = loop.func.node if loop.func.node is not None else loop.module.tree
    # target networks under no_grad, and actions picked with grad on (`argmax(q_network(obs))`), stay eager
    # a model's other methods (`vae.encode(x)`, `model.generate(...)`) stay eager, as any call of the loop body
    model_calls = [
        c for c in calls if _called_as_module(c, env) and id(c) not in without_grad and not _never_differentiated(c, body, scope)
    ]
    passes = _models_passed_to_helpers(loop, {id(c) for c in calls}, without_grad, body, scope)
    names = [_module_called(c) for c in model_calls] + [dotted(p.model) for p in passes]
    if not names or None in names:
        raise Refusal(LOOP_SHAPE, "partial capture needs the models called by name, outside no_grad in the loop body")
    for call, name in zip([*model_calls, *(p.inner for p in passes)], names):
        if "." in name and not _forward_nodes(loop, call):  # `self.model` handed in from elsewhere: its forward unseen
            raise Refusal(LOOP_SHAPE, f"partial capture needs the class of `{name}` known, to check its forward", call)
    rebound = _attributes_assigned(loop) & set(names)
    if rebound:  # the graphed module is made once, before the loop: it would keep graphing the first model
        raise Refusal(LOOP_SHAPE, f"partial capture needs `{min(rebound)}` kept the same model while the loop runs")
    for call in model_calls:
        _check_arguments(call, call.func, env, passed_arguments(call, env))
    for p in passes:
        _check_arguments(p.call, p.model, p.caller_env, passed_arguments(p.inner, p.env))
    if not _runs_backward(loop, calls, env, passes):
        raise Refusal(LOOP_SHAPE, "partial capture needs the backward pass in the loop body, or in a helper it hands the model to")
    # A call made while the last replay's backward is still to come runs eagerly (GraphedModule), so the
    # model may be called under a condition, or more than once per step.
    forward = {n for call in [*model_calls, *(p.inner for p in passes)] for n in _forward_nodes(loop, call)}
    read_in_forward = {n.value for n, _ in loop.region.nodes if isinstance(n, cst.Name) and id(n) in forward}
    in_loop = {id(n) for n, _ in loop.region.nodes}
    for rule, node in breakers:
        if rule is MUTATED_STATE and _fills_host_buffer(node, scope, read_in_forward):
            continue  # a replay buffer of the eager code around the models: no graph reads it
        if (
            rule.fix.partial is Partial.UNLESS_UNREAD
            and node is not None
            and id(node) in in_loop
            and id(node) not in forward
            and not _feeds(node, [*model_calls, *(p.call for p in passes)], body)
        ):
            continue  # padding no model reads (packed targets, outputs): the models' inputs may keep one shape
        if rule.fix.partial is not Partial.EAGER:
            raise Refusal(rule, f"partial capture cannot leave {rule.code} ({rule.name}) eager", node)
        if node is not None and id(node) in forward:
            raise Refusal(rule, "the model's forward itself would be captured with it", node)
    return PartialPlan(loop, model_calls, list(dict.fromkeys(names)), list(reasons), [p.model for p in passes])


def _runs_backward(loop: Loop, calls: list[cst.Call], env, passes: list) -> bool:
    """A backward in the loop body, or one run out of sight by a helper it hands the loss and optimizer to
    (`loss_scaler(loss, optimizer)`), or in a helper it hands the model to (`loss = train(model, data)`)."""
    if any(is_backward(c, env) or is_delegated_step(c, env) for c in calls):
        return True
    return bool(passes) and any(isinstance(n, cst.Call) and is_backward(n, site.env) for n, site in loop.region.nodes)


def _check_arguments(call: cst.Call, model: cst.BaseExpression, model_env, passed) -> None:
    """The model must be a plain module called with tensors; `passed`: what the model is called with
    (passed_arguments), where `call` calls it or hands it to a helper that does."""
    if model_env.kind_of(model) == DDP:  # its gradients are all-reduced from hooks in the backward a graph would hold
        raise Refusal(DDP_MODEL, "partial capture does not graph a DistributedDataParallel model", call)
    positional, _, hidden = passed
    if not positional or hidden:
        raise Refusal(LOOP_SHAPE, "partial capture needs the model called with positional tensors (and keyword values)")
    if any(is_host_expression(value, env) for env, value in positional):
        raise Refusal(LOOP_SHAPE, "partial capture needs the model called with tensors (a host value is a positional argument)")


@dataclass
class _ModelPass:
    call: cst.Call  # `forward_(model, x)` in the loop body
    model: cst.BaseExpression  # `model` there: the graphed module is passed instead
    inner: cst.Call  # `module(*args)` in the helper: the model call it makes
    env: object  # the helper's env, its parameters bound to this call's arguments
    caller_env: object  # where `call` stands (the loop body, or a closure defined there)


def _models_passed_to_helpers(loop: Loop, written: set[int], without_grad: set[int], body, scope) -> list[_ModelPass]:
    """Models the loop body hands to a function that calls them (`forward_(model, x)` with
    `def forward_(module, *args): return module(*args)`), with grad on; `written`: ids of the calls
    written in the loop body (closures defined there included). The function must do nothing with its
    parameter but call it, so that a graphed module passed instead serves every use."""
    region = loop.region
    passes = []
    for node, site in region.nodes:
        block = site.block
        if type(node) is not cst.Call or id(block.call) not in written or not is_model_call(node, site.env):
            continue
        param = node.func.value if isinstance(node.func, cst.Name) else None
        if param is None or param not in site.env.bound:
            continue
        if any(isinstance(a, cst.With) and any(is_no_grad_item(i.item, site.env) for i in a.items) for a in site.ancestors):
            continue
        helper = block.func
        # the helper is walked once, from its first call; the later ones may hand it other models
        callers = [(block.call, block.parent.env)] + [(c, s.env) for c, s in region.repeats.get(id(helper.node), []) if id(c) in written]
        for call, caller_env in callers:
            env = helper.new_env()
            bind_arguments(helper, helper.cls is not None, call, caller_env, env)
            model = env.bound[param][1] if param in env.bound else None
            if model is None or id(call) in without_grad or caller_env.kind_of(model) not in (MODEL, DDP):
                continue
            if _never_differentiated(call, body, scope):
                continue
            if not _only_called(param, helper.node):
                raise Refusal(LOOP_SHAPE, f"partial capture needs `{param}` only called in `{helper.qualname}`", call)
            passes.append(_ModelPass(call, model, node, env, caller_env))
    return passes


def _only_called(param: str, func: cst.FunctionDef) -> bool:
    """Whether a function does nothing with its parameter `param` but call it and read its attributes
    (`model.train()`, `model.parameters()`): what the graphed model it is handed instead answers as the
    model does. Passed on, stored, returned or tested (`isinstance`), it would be the wrapper."""
    declared = {id(p.name) for n in walk(func) if isinstance(n, cst.Param) for p in [n]}
    callees = {id(n.func) for n in walk(func) if isinstance(n, cst.Call)}
    owners = {id(n.value) for n in walk(func) if isinstance(n, cst.Attribute)}
    uses = [n for n in walk(func) if isinstance(n, cst.Name) and n.value == param and id(n) not in declared]
    return all(id(n) in callees or id(n) in owners for n in uses)


def _feeds(value: cst.CSTNode, model_calls: list[cst.Call], body: list[cst.BaseStatement]) -> bool:
    """Whether a model call's arguments hold `value`, directly or through names the loop body binds from it."""
    derived: set[str] = set()

    def holds(expr: cst.CSTNode) -> bool:
        return any(n is value or (isinstance(n, cst.Name) and n.value in derived) for n in walk(expr))

    assigns = [n for s in body for n in walk(s) if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign)) and n.value is not None]
    while True:  # to a fixed point: `padded = pad(...)`, then `padded = padded.to(device)`
        bound = {name for n in assigns if holds(n.value) for name in names_written(n)} - derived
        if not bound:
            break
        derived |= bound
    return any(holds(arg.value) for call in model_calls for arg in call.args)


_INDEX_OR_HOST = {"argmax", "argmin", "detach", "item", "tolist"}  # what no gradient flows back through


def _never_differentiated(call: cst.Call, body: list[cst.BaseStatement], scope: cst.CSTNode) -> bool:
    """Whether the model call's result only ever reaches argmax/argmin, detach, item, tolist, float or int, directly
    or through a name bound to it (an agent picking its action with gradients on). No backward reaches
    such a call: graphed, it would leave the graph waiting for one, and the model eager from then on."""

    def only_read_by(c: cst.Call, value: cst.CSTNode) -> bool:
        m = method_call(c)
        if m is not None and m[0] is value and m[1] in _INDEX_OR_HOST:
            return True
        name = dotted(c.func) or ""
        # `float(loss)` and `int(n)` read it on the host as `.item()` does
        return name.rsplit(".", 1)[-1] in ("argmax", "argmin", "float", "int") and bool(c.args) and c.args[0].value is value

    nodes = [n for s in body for n in walk(s)]
    if any(isinstance(n, cst.Call) and only_read_by(n, call) for n in nodes):
        return True
    bound = next((n for n in nodes if isinstance(n, cst.Assign) and n.value is call and len(n.targets) == 1), None)
    if bound is None or not isinstance(bound.targets[0].target, cst.Name):
        return False
    name = bound.targets[0].target.value
    scope_nodes = list(walk(scope))
    occurrences = [n for n in scope_nodes if isinstance(n, cst.Name) and n.value == name]
    targets = {id(t.target) for n in scope_nodes if isinstance(n, cst.Assign) for t in n.targets}
    reads = {id(a.value) for n in scope_nodes if isinstance(n, cst.Call) for a in n.args[:1] if only_read_by(n, a.value)}
    reads |= {
        id(n.func.value)
        for n in scope_nodes
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and only_read_by(n, n.func.value)
    }
    return bool(reads) and all(id(n) in targets or id(n) in reads for n in occurrences)


_FRESH_ARRAYS = {"zeros", "ones", "empty", "full", "array", "zeros_like", "ones_like", "empty_like", "full_like", "tensor"}


def _fills_host_buffer(node: cst.CSTNode | None, scope: cst.CSTNode, read_in_forward: set[str]) -> bool:
    """Whether a GFY703 mutation only writes items of arrays the loop's function made itself
    (`observations[slot] = obs` into `observations = np.zeros(...)`), which the models' forward does not
    read: the eager code around the graphed models reads them afresh each step. An array bound to
    anything else may alias a module's state, so it is not taken."""
    assign = node.body[0] if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1 else node
    if not isinstance(assign, cst.Assign):
        return False
    targets = [
        e.value if isinstance(e, cst.Element) else e
        for t in assign.targets
        for e in (t.target.elements if isinstance(t.target, (cst.Tuple, cst.List)) else [t.target])
    ]
    roots = []
    for target in targets:
        if not isinstance(target, cst.Subscript):  # an item written, not a name or attribute
            return False
        while isinstance(target, cst.Subscript):
            target = target.value
        if not isinstance(target, cst.Name):
            return False
        roots.append(target.value)
    bindings = [
        n for n in walk(scope) if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.With, cst.Global, cst.Nonlocal))
    ]
    for root in roots:
        if root in read_in_forward:
            return False
        made = [n for n in bindings if root in names_written(n)]
        if not made or not all(isinstance(n, cst.Assign) and _is_fresh_array(n.value) for n in made):
            return False
    return True


def _is_fresh_array(value: cst.BaseExpression) -> bool:
    name = dotted(value.func) if isinstance(value, cst.Call) else None
    return name is not None and name.split(".")[0] in ("np", "numpy", "torch") and name.rsplit(".", 1)[-1] in _FRESH_ARRAYS


def _called_as_module(call: cst.Call, env) -> bool:
    """`model(x)`, `self.model(x)`, `model.forward(x)`: what a GraphedModule of the model would run."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "forward":
        return env.kind_of(call.func.value) in (MODEL, DDP)
    return env.kind_of(call.func) in (MODEL, DDP)


def _module_called(call: cst.Call) -> str | None:
    """`model` or `self.model` for `model(x)` or `self.model(x)`; None for a method (`model.forward(x)`)."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("forward", "generate"):
        return None
    return dotted(call.func)


def _attributes_assigned(loop: Loop) -> set[str]:
    """Attribute chains (`self.model`) assigned anywhere the loop's iterations run, as written there."""
    return {
        dotted(t)
        for n, _ in loop.region.nodes
        if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign))
        for t in attribute_targets(n)
        if dotted(t)
    }


def _forward_nodes(loop: Loop, call: cst.Call) -> set[int]:
    """ids of the nodes the model call runs (its forward, when the model's class is analysed)."""
    region = loop.region
    leading: dict[int, set[int]] = {}  # per block: the calls that lead to it
    found = set()
    for n, site in region.nodes:
        if site.block is region.body_block:
            continue
        calls = leading.get(id(site.block))
        if calls is None:
            calls = leading[id(site.block)] = region.calls_leading_to(site)
        if id(call) in calls:
            found.add(id(n))
    return found
