"""Loop discovery: which loops train or infer, and what runs in one of their iterations."""

from __future__ import annotations

from functools import cached_property
from typing import Iterator

import libcst as cst

from graphify.analysis.names import class_made, dotted
from graphify.analysis.program import FunctionInfo, ModuleInfo
from graphify.analysis.tree import children, descendants
from graphify.analysis.values import Env
from graphify.analysis.vocabulary import OPTIMIZER, kind_by_name
from graphify.analysis.calls import (
    enclosing_function,
    _is_step_like,
    _iter_nodes,
    _iter_nodes_all,
    bind_free_names,
    local_function,
    nested_functions,
    _mentions_no_grad,
    returned_closure,
    is_backward,
    is_mapped_lambda,
    is_optimizer_step,
    is_model_call,
    is_no_grad_item,
    is_periodic_gpu_branch,
    is_step_op,
)
from graphify.analysis.hand_capture import CAPTURED, SKIPPED, captured_kind, hand_capture_role
from graphify.analysis.region import Block, Loop, Region, Site
from graphify.analysis.submodules import container_items, iterables_binding, iterates_submodules, module_classes_called
from graphify.analysis.rewritten import is_runtime_helper, runtime_helper_assignments
from graphify.analysis.targets import seed_loop_target

MAX_CALL_DEPTH = 8
# Tested with `type(n) in`, as calls._SKIP (why: there).
LOOPS = frozenset({cst.For, cst.While})
_SKIP = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})


# ---- analysis of one module --------------------------------------------------------------------


class ModuleAnalysis:
    def __init__(self, module: ModuleInfo) -> None:
        self.module = module
        self._enclosing_envs: dict[int, Env] = {}  # enclosing function id -> its env (_enclosing_env)

    # Loop sites with their enclosing function/class and ancestors.
    def loop_sites(self) -> Iterator[tuple[cst.For | cst.While, FunctionInfo, tuple[cst.CSTNode, ...]]]:
        def visit(node, func_node, cls, ancestors):
            for child in children(node):
                kind = type(child)
                if kind is cst.FunctionDef:
                    yield from visit(child, child, cls, ancestors + (child,))
                elif kind is cst.ClassDef:
                    yield from visit(child, None, child, ancestors + (child,))
                else:
                    if kind in LOOPS:
                        yield child, self.module.function_info(func_node, cls if func_node is not None else None), ancestors
                    yield from visit(child, func_node, cls, ancestors + (child,))

        yield from visit(self.module.tree, None, None, ())

    def loops(self) -> list[Loop]:
        sites = list(self.loop_sites())
        found: list[Loop] = []
        absorbed: dict[int, int] = {}  # loop node id -> id of the step loop whose region runs it
        for node, func, ancestors in sites:
            if id(node) in absorbed:
                continue
            role = hand_capture_role(self.module, func, node, ancestors, self._captured_steps)
            if role == CAPTURED:
                found.append(self._by_hand(node, func, ancestors))
                absorbed.update((id(n), id(node)) for n in _iter_nodes(node.body) if type(n) in LOOPS)
                continue
            if role == SKIPPED or not self._could_step_or_infer(node, ancestors):
                continue
            env = self._loop_env(node, func)
            body = Block(func, env, [node])
            captured = self._already_captured(node, env)
            direct_steps, direct_models = (False, False) if captured else self._direct_work(body, node)
            if direct_steps and self._only_flushes(body, node):
                continue  # an epoch loop stepping what its step loop accumulated (`if leftover: opt.step()`)
            if captured or direct_steps:
                region = self._region(body, node, include_nested=self._is_separate_eval_loop)
                for n, _ in region.nodes:
                    if type(n) in LOOPS and n is not node:
                        absorbed.setdefault(id(n), id(node))
                if not captured:
                    found.append(Loop(node, func, "train", region, ancestors))
            elif (
                direct_models
                and not self._has_step_anywhere(body, node)
                and self._under_no_grad(node, func, ancestors, env)
                and not iterates_submodules(node, env)
            ):
                region = self._region(body, node, include_nested=lambda *a: False)
                found.append(Loop(node, func, "inference", region, ancestors))
        # A loop found before the step loop that runs it (micro-steps in a helper defined above the batch
        # loop) is part of that step, not a loop of its own: reported alone, it would be rewritten twice.
        return [loop for loop in found if not _runs_inside_another(id(loop.node), absorbed)]

    @cached_property
    def _steppers(self) -> set[str]:
        """Names of functions and methods of this module that run a backward or optimizer step, and of the
        objects it makes of a class whose `__call__` does (`loss_scaler = NativeScaler()`, whatever the
        optimizer it is handed is called)."""
        found = set()
        for node in _iter_nodes_all(self.module.tree):
            if type(node) is cst.FunctionDef and any(_is_step_like(n) for n in _iter_nodes(node.body)):
                found.add(node.name.value)
        stepping_classes = {
            name
            for name, cls in self.module.classes.items()
            if (call := self.module.method(cls, "__call__")) is not None and any(_is_step_like(n) for n in _iter_nodes(call.body))
        }
        for node in _iter_nodes_all(self.module.tree):
            if type(node) is cst.Assign and type(node.value) is cst.Call and dotted(node.value.func) in stepping_classes:
                found.update(target.value for t in node.targets for target in [t.target] if type(target) is cst.Name)
                found.update(t.target.attr.value for t in node.targets if type(t.target) is cst.Attribute)
        return found

    def _could_step_or_infer(self, loop, ancestors) -> bool:
        """A syntactic test, before any inference: the loop calls `.backward()`/`.step()`, a function
        that does, something imported, or runs under no_grad."""
        if any(_mentions_no_grad(a) for a in ancestors if isinstance(a, (cst.With, cst.FunctionDef))):
            return True
        enclosing = next((a for a in reversed(ancestors) if isinstance(a, cst.FunctionDef)), None)
        if enclosing is not None and enclosing.name.value in self._called_without_grad:
            return True
        for n in _iter_nodes(loop):
            if _is_step_like(n) or (isinstance(n, cst.With) and _mentions_no_grad(n)):
                return True
            if isinstance(n, cst.Call):
                f = n.func
                name = f.value if isinstance(f, cst.Name) else f.attr.value if isinstance(f, cst.Attribute) else None
                if name in self._steppers or (isinstance(f, cst.Name) and name in self.module.aliases.from_imports):
                    return True
                if any(kind_by_name(dotted(a.value) or "") == OPTIMIZER for a in n.args):
                    return True  # `loss_scaler(loss, optimizer, ...)`: a helper that may own the step
        return False

    def _by_hand(self, node, func: FunctionInfo, ancestors) -> Loop:
        """A warmup or replay loop of a graph the script captures itself: reported, never rewritten."""
        region = self._region(Block(func, self._loop_env(node, func), [node]), node, include_nested=lambda *a: False)
        return Loop(node, func, captured_kind(func, self.module), region, ancestors, by_hand=True)

    @cached_property
    def _captured_steps(self) -> set[str]:
        """Functions wrapped as `f = CapturedStep(f)`."""
        return {wrapped.value for _, wrapped in runtime_helper_assignments(self.module) if isinstance(wrapped, cst.Name)}

    @staticmethod
    def _already_captured(loop, env: Env) -> bool:
        """A loop that `graphify rewrite` already turned into replays of a `CapturedStep` (or a `GraphedModule`,
        called in the body or in a closure defined there)."""
        for n in _iter_nodes_all(loop.body):
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name):
                for value in env.values_of(n.func.value):
                    if isinstance(value, cst.Call) and is_runtime_helper(value.func, env.module):
                        return True
        return False

    # ---- environments -----------------------------------------------------------------------

    def _loop_env(self, node: cst.For | cst.While, func: FunctionInfo) -> Env:
        env = func.new_env()
        seeds: dict[str, bool] = {}
        if isinstance(node, cst.For):
            seed_loop_target(node.target, node.iter, env, seeds)
        self._bind_from_call_site(func, env, seeds)
        outer = self._enclosing_env(func.node)
        if outer is not None:  # a loop in `def update():` inside `def ppo(...)` reads ppo's model and optimizers
            bind_free_names(func, env, outer, seeds)
        env.infer(seeds, func.scope)
        return env

    def _enclosing_env(self, node: cst.FunctionDef | None) -> Env | None:
        """The env of the module function or method a nested function is defined in, its parameters bound
        from its call site: what the nested function's free names mean. None for a function not nested."""
        enclosing = enclosing_function(node, self.module) if node is not None else None
        if enclosing is None:
            return None
        cached = self._enclosing_envs.get(id(enclosing[0]))
        if cached is None:
            outer = self.module.function_info(*enclosing)
            cached = self._enclosing_envs[id(enclosing[0])] = outer.new_env()
            seeds: dict[str, bool] = {}
            self._bind_from_call_site(outer, cached, seeds)
            cached.infer(seeds, outer.scope)
        return cached

    def _bind_from_call_site(self, func: FunctionInfo, env: Env, seeds: dict[str, bool], depth: int = 0) -> None:
        """Parameters of the loop's function take their meaning from a call site in the module
        (`train(model, loader, optimizer)` called from `main()`), and the caller's from its own call
        site, a few levels up (`main()` -> `train()` -> `train_epoch()`), so constructions can be found."""
        if func.node is None or depth > 3:
            return
        site = self.call_sites.get(func.node.name.value)
        if site is None:
            return
        call, caller = site
        caller_env = caller.new_env()
        if caller.node is not func.node:
            self._bind_from_call_site(caller, caller_env, {}, depth + 1)
        bind_arguments(func, func.cls is not None, call, caller_env, env, keep=set(seeds))

    @cached_property
    def call_sites(self) -> dict[str, tuple[cst.Call, FunctionInfo]]:
        """First call of each module-level function or `self.` method, with the calling function."""
        sites: dict[str, tuple[cst.Call, FunctionInfo]] = {}

        def visit(node, func_node, cls):
            for child in children(node):
                kind = type(child)
                if kind is cst.FunctionDef:
                    visit(child, child, cls)
                elif kind is cst.ClassDef:
                    visit(child, None, child)
                else:
                    if kind is cst.Call:
                        f = child.func
                        name = (
                            f.value
                            if isinstance(f, cst.Name)
                            else f.attr.value
                            if (isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == "self")
                            else None
                        )
                        if name and name not in sites:
                            sites[name] = (child, self.module.function_info(func_node, cls if func_node is not None else None))
                    visit(child, func_node, cls)

        visit(self.module.tree, None, None)
        return sites

    def callee(self, call: cst.Call, env: Env) -> tuple[FunctionInfo, bool] | None:
        """The analysed function a call runs, and whether it is a bound method (first parameter is self)."""
        module = env.module
        func = call.func
        if isinstance(func, cst.Name):
            name = func.value
            closure = self._closure(name, env)
            if closure is not None:
                return closure, False
            if name in module.functions:
                return module.function_info(module.functions[name], None), False
            if name in module.classes:
                return None
            imported = module.imported_module(name)
            if imported is not None:
                other, real = imported
                if real in other.functions:
                    return other.function_info(other.functions[real], None), False
            returned = returned_closure(name, env)
            if returned is not None:
                return module.function_info(returned[0], None), False
            cls = self._local_class_of(func, env)
            if cls is not None:
                fwd = module.method(cls, "forward")
                return (module.function_info(fwd, cls), True) if fwd is not None else None
            return None
        if isinstance(func, cst.Attribute):
            owner = func.value
            if isinstance(owner, cst.Name) and owner.value == "self" and env.func.cls is not None:
                method = module.method(env.func.cls, func.attr.value)
                if method is not None:
                    return module.function_info(method, env.func.cls), True
            cls = self._local_class_of(owner, env)
            if cls is not None:
                method = module.method(cls, func.attr.value)
                if method is not None:
                    return module.function_info(method, cls), True
            cls = self._local_class_of(func, env)  # self.model(x) where self.model = LocalNet()
            if cls is not None:
                fwd = module.method(cls, "forward")
                if fwd is not None:
                    return module.function_info(fwd, cls), True
        return None

    def _closure(self, name: str, env: Env) -> FunctionInfo | None:
        """A function defined inside the calling code (`def _backward(loss): ...` in the loop)."""
        node = local_function(name, env)
        return self.module.function_info(node, env.func.cls if env.func is not None else None) if node is not None else None

    def _local_class_of(self, expr: cst.BaseExpression, env: Env, depth: int = 0) -> cst.ClassDef | None:
        name = dotted(expr)
        if (name is None and type(expr) is not cst.Call) or depth > 4:
            return None
        if name in env.bound and not env.values_of(name):  # a parameter: what its call site passed
            caller, arg = env.bound[name]
            return self._local_class_of(arg, caller, depth + 1)
        for value in env.values_of(name) if name else [expr]:
            made = class_made(value, env.module.classes)
            if made is not None:
                return env.module.classes[made]
        if name is not None and "." not in name:  # `for level in self.levels: level(x)` over an nn.ModuleList
            for iterable in iterables_binding(name, env):
                cls = self._element_class(iterable, env, depth + 1)
                if cls is not None:
                    return cls
        return None

    def _element_class(self, container: cst.BaseExpression, env: Env, depth: int) -> cst.ClassDef | None:
        """The local class every item of a container of modules is made of: `nn.ModuleList([Level(...) for
        ...])`, `nn.Sequential(Block(), Block())`, `[Block(...), Block(...)]`, or a name bound to one."""
        name = dotted(container)
        values = env.values_of(name) if name else [container]
        for value in values:
            items = container_items(value, env)
            classes = {class_made(item, env.module.classes) for item in items}
            if items and len(classes) == 1 and None not in classes:
                return env.module.classes[classes.pop()]
        return None

    def callees(self, call: cst.Call, env: Env) -> list[tuple[FunctionInfo, bool]]:
        """The analysed functions a call runs: the one `callee` finds, or the forward of every module of this
        file that a call of a container of modules runs (submodules.module_classes_called)."""
        resolved = self.callee(call, env)
        if resolved is not None:
            return [resolved]
        module = env.module
        forwards = [(module.method(cls, "forward"), cls) for cls in module_classes_called(call.func, env)] if module is not None else []
        return [(module.function_info(fwd, cls), True) for fwd, cls in forwards if fwd is not None]

    def _callee_blocks(self, call: cst.Call, caller: Block) -> list[Block]:
        return [self._callee_block(call, caller, info, bound) for info, bound in self.callees(call, caller.env)]

    def _callee_block(self, call: cst.Call, caller: Block, info: FunctionInfo, bound: bool) -> Block:
        env, seeds = self._bound_env(info, bound, call, caller.env)
        if isinstance(call.func, cst.Name) and self._closure(call.func.value, caller.env) is info:
            # a closure's free names mean what they mean where it is defined: the caller, or the function
            # enclosing both (`update()` calling `compute_loss()`, both defined in `ppo()`)
            defined_in_caller = caller.func.node is not None and nested_functions(caller.func.node).get(call.func.value) is info.node
            outer = caller.env if defined_in_caller or caller.func.node is None else self._enclosing_env(info.node)
            bind_free_names(info, env, outer or caller.env, seeds)
        elif isinstance(call.func, cst.Name) and (returned := returned_closure(call.func.value, caller.env)) is not None:
            _, factory, built = returned  # the closure reads its factory's names, bound where the factory was called
            factory_env, factory_seeds = self._bound_env(info.module.function_info(factory, None), False, built, caller.env)
            factory_env.infer(factory_seeds, factory_env.func.scope)
            bind_free_names(info, env, factory_env, seeds)
        env.infer(seeds, info.scope)
        return Block(info, env, list(info.node.body.body), call, caller)

    @staticmethod
    def _bound_env(info: FunctionInfo, bound: bool, call: cst.Call, caller: Env) -> tuple[Env, dict[str, bool]]:
        """A called function's env, its parameters bound to the call's arguments, and the tensor/host seeds."""
        env = info.new_env()
        seeds: dict[str, bool] = {}
        bind_arguments(info, bound, call, caller, env)
        for name, (source_env, value) in env.bound.items():
            if (verdict := source_env._tensor(value, 0)) is not None:
                seeds[name] = verdict
        return env, seeds

    # ---- walking ----------------------------------------------------------------------------

    def _walk(self, block: Block, root: cst.CSTNode, skip_nested, follow: bool, visited: set[int], depth: int = 0, repeats=None):
        """Yield (node, Site) for everything one iteration of the loop `root` runs (or one statement of a
        called function), following calls into analysed functions: each once, from its first call;
        `repeats` (function id -> [(call, Site)]) receives the later calls."""
        loop = root if block.call is None else None
        stack: list[tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]] = [(root, ())]
        pending: list[Block] = []
        while stack:
            node, ancestors = stack.pop()
            kind = type(node)
            # a function defined in a called function runs when it is called, not where it is defined
            if kind in _SKIP and (ancestors or block.call is not None) and not is_mapped_lambda(node, ancestors):
                continue
            if kind in LOOPS and node is not loop and skip_nested(node, block, ancestors):
                continue
            if node is not loop:
                yield node, Site(block, ancestors)
            if follow and isinstance(node, cst.Call) and depth < MAX_CALL_DEPTH and not self._in_periodic_branch(ancestors, block):
                for callee in self._callee_blocks(node, block):
                    if id(callee.func.node) not in visited:
                        visited.add(id(callee.func.node))
                        pending.append(callee)
                    elif repeats is not None:
                        repeats.setdefault(id(callee.func.node), []).append((node, Site(block, ancestors)))
            child_ancestors = ancestors + (node,)
            kids = children(node)
            if isinstance(node, cst.For) and node is loop:
                kids = [node.body]  # the iterable is evaluated once, before the loop
            stack.extend((k, child_ancestors) for k in reversed(kids))
        for callee in pending:
            for stmt in callee.stmts:
                yield from self._walk(callee, stmt, skip_nested, follow, visited, depth + 1, repeats)

    def _direct_work(self, block: Block, loop: cst.CSTNode) -> tuple[bool, bool]:
        steps = models = False
        for node, site in self._walk(block, loop, lambda *a: True, True, {id(block.func.node)}):
            if isinstance(node, cst.Call):
                steps = steps or is_step_op(node, site.env)
                models = models or is_model_call(node, site.env)
        return steps, models

    def _only_flushes(self, block: Block, loop: cst.CSTNode) -> bool:
        """Whether the loop's own steps only apply gradients a nested loop accumulated: it runs no backward and
        no model itself, and a loop nested in it runs a backward pass and steps an optimizer (a step loop)."""
        own = [(n, s) for n, s in self._walk(block, loop, lambda *a: True, True, {id(block.func.node)}) if isinstance(n, cst.Call)]
        if any(is_backward(n, s.env) or is_model_call(n, s.env) for n, s in own):
            return False
        for nested in (n for n in _iter_nodes(loop.body) if type(n) in LOOPS):
            calls = [
                (n, s)
                for n, s in self._walk(Block(block.func, block.env, [nested]), nested, lambda *a: True, True, set())
                if isinstance(n, cst.Call)
            ]
            if any(is_backward(n, s.env) for n, s in calls) and any(is_optimizer_step(n, s.env) for n, s in calls):
                return True
        return False

    def _has_step_anywhere(self, block: Block, loop: cst.CSTNode) -> bool:
        return any(is_step_op(n, s.env) for n, s in self._walk(block, loop, lambda *a: False, True, {id(block.func.node)}))

    def _calls_model(self, loop: cst.CSTNode, block: Block) -> bool:
        sub = Block(block.func, block.env, [loop], block.call)
        return any(isinstance(n, cst.Call) and is_model_call(n, s.env) for n, s in self._walk(sub, loop, lambda *a: True, False, set()))

    def _is_separate_eval_loop(self, nested: cst.CSTNode, block: Block, ancestors) -> bool:
        """Skip a nested loop that is an evaluation loop of its own (it is reported separately)."""
        sub = Block(block.func, block.env, [nested], block.call)
        if self._has_step_anywhere(sub, nested):
            return False
        if not self._calls_model(nested, block):
            return False
        return self._under_no_grad(nested, block.func, ancestors, block.env)

    def _region(self, body: Block, loop, include_nested) -> Region:
        region = Region(loop, body.func, blocks=[body])
        visited = {id(body.func.node)}
        for node, site in self._walk(body, loop, include_nested, True, visited, repeats=region.repeats):
            region.nodes.append((node, site))
            if site.block not in region.blocks:
                region.blocks.append(site.block)
        return region

    def _under_no_grad(self, node, func: FunctionInfo, ancestors, env: Env) -> bool:
        for a in ancestors:
            if isinstance(a, cst.With) and any(is_no_grad_item(i.item, env) for i in a.items):
                return True
        if func.node is not None and any(is_no_grad_item(d.decorator, env) for d in func.node.decorators):
            return True
        if func.node is not None and func.node.name.value in self._called_without_grad:
            return True  # `with torch.no_grad(): val_loss = evaluate(model, loader)` in its caller
        # `with torch.no_grad():` inside the loop body
        for n, _ in self._walk(Block(func, env, [node]), node, lambda *a: True, False, set()):
            if isinstance(n, cst.With) and any(is_no_grad_item(i.item, env) for i in n.items):
                return True
        return False

    @cached_property
    def _called_without_grad(self) -> set[str]:
        """Names of functions and methods the module calls with gradients off: inside `with torch.no_grad():`
        or in a function decorated so, and, a few levels down, the functions those call."""
        env = self.module.function_info(None, None).new_env()
        names: set[str] = set()
        bodies: dict[str, list[cst.FunctionDef]] = {}

        def visit(node, off: bool) -> None:
            for child in children(node):
                kind = type(child)
                if kind is cst.FunctionDef:
                    bodies.setdefault(child.name.value, []).append(child)
                    visit(child, any(is_no_grad_item(d.decorator, env) for d in child.decorators))
                    continue
                if kind is cst.With and any(is_no_grad_item(i.item, env) for i in child.items):
                    visit(child, True)
                    continue
                if off and kind is cst.Call:
                    names.add(_called_name(child))
                visit(child, off)

        visit(self.module.tree, False)
        for _ in range(3):  # what those functions call runs without grad too
            called = {_called_name(n) for name in names for f in bodies.get(name, []) for n in descendants(f) if type(n) is cst.Call}
            if called <= names:
                break
            names |= called
        return names - {None}

    def _in_periodic_branch(self, ancestors, block: Block) -> bool:
        """Calls under a host-side `if` that does evaluation-like work are not followed: that work runs
        eagerly between replays (GFY502) and is analysed as its own loop."""
        for a in ancestors:
            if isinstance(a, cst.If) and is_periodic_gpu_branch(a, block.env):
                return True
        return False


def _called_name(call: cst.Call) -> str | None:
    """`evaluate` for `evaluate(...)`, `self.evaluate(...)` and `ddpm.sample(...)`'s `sample`."""
    func = call.func
    return func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None


def passed_arguments(
    call: cst.Call, caller: Env
) -> tuple[list[tuple[Env, cst.BaseExpression]], dict[str, tuple[Env, cst.BaseExpression]], bool]:
    """What a call passes, positional and by keyword, each with the env it is evaluated in; a `*args` or
    `**kwargs` of the caller's own, passed on (`module(*args, **kwargs)`), stands for what the caller was
    passed. The flag: whether some other `*`/`**` argument hides what is passed."""
    positional: list[tuple[Env, cst.BaseExpression]] = []
    keywords: dict[str, tuple[Env, cst.BaseExpression]] = {}
    hidden = False
    caller_star, caller_kwargs = caller.func.star_params if caller.func is not None else (None, None)
    for arg in call.args:
        forwarded = dotted(arg.value)
        if arg.star == "*" and forwarded is not None and forwarded == caller_star:
            positional += caller.star_bound
        elif arg.star == "**" and forwarded is not None and forwarded == caller_kwargs:
            keywords.update(caller.kwargs_bound)
        elif arg.star:
            hidden = True
        elif arg.keyword is not None:
            keywords[arg.keyword.value] = (caller, arg.value)
        else:
            positional.append((caller, arg.value))
    return positional, keywords, hidden


def bind_arguments(info: FunctionInfo, bound: bool, call: cst.Call, caller: Env, env: Env, keep: set[str] = frozenset()) -> None:
    """Bind a called function's parameters (in `env`) to the call's arguments, as Python does: positional
    ones in order, the rest into `*args`; keywords by name, the rest into `**kwargs`."""
    positional, keywords, _ = passed_arguments(call, caller)
    params = info.positional_params[1:] if bound else info.positional_params
    star, star_kwargs = info.star_params
    for name, value in zip(params, positional):
        if name not in keep:
            env.bound[name] = value
    if star is not None:
        env.star_bound = positional[len(params) :]
    for name, value in keywords.items():
        if name in info.params and name not in keep:
            env.bound[name] = value
        elif star_kwargs is not None:
            env.kwargs_bound[name] = value


def _runs_inside_another(loop: int, absorbed: dict[int, int]) -> bool:
    """Whether a step loop's region runs `loop`, and `loop`'s own region does not run that loop back
    (a recursion between two helpers keeps both)."""
    outer = absorbed.get(loop)
    return outer is not None and outer != loop and absorbed.get(outer) != loop
