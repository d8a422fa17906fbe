"""What a rule sees of one loop, and the helpers rules share."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterator

import libcst as cst

from graphify.analysis.calls import is_backward, is_model_call, is_optimizer_step, is_step_op, iter_nodes, method_call
from graphify.analysis.region import Loop, Region, Site
from graphify.analysis.scope import collect_scope
from graphify.analysis.statements import names_written
from graphify.analysis.targets import unwrap_iterable
from graphify.analysis.tree import returns
from graphify.analysis.names import code_text, dotted
from graphify.analysis.program import ModuleInfo
from graphify.analysis.values import Env
from graphify.analysis.vocabulary import (
    ADAM_FAMILY,
    KNOWN_OPTIMIZERS,
    MODEL,
    OPTIMIZER,
    PURE_BUILTINS,
    SCALER,
    is_tensor_metadata_method,
    is_torch_tensor_call,
)
from graphify.model import Rule


def code_of(node: cst.CSTNode, limit: int = 60) -> str:
    """The node's source on one line, comments dropped, shortened for a message."""
    lines = code_text(node).splitlines()
    text = " ".join(" ".join(line.split("  #", 1)[0].split() if "  #" in line else line.split()) for line in lines)
    text = text.replace("( ", "(").replace(" )", ")")
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Finding:
    rule: Rule
    node: cst.CSTNode
    module: ModuleInfo
    message: str
    fix: str
    removable: bool | None = None  # None: as the rule says
    # Where its family's walk of the loop reached it, for the findings of a family's rules to come in one
    # order (the engine sorts them by it); None: the position of the node in the loop's walk.
    order: tuple | None = None


def removable(finding: Finding) -> bool:
    """Whether `graphify rewrite` removes this breaker (its rule can, and its context does not defeat it)."""
    return finding.rule.rewritable and finding.removable is not False


def kwarg(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def is_true(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "True"


class Checker:
    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.region = loop.region

    def nodes(self) -> Iterator[tuple[cst.CSTNode, Site]]:
        return iter(self.region.nodes)

    def calls(self) -> Iterator[tuple[cst.Call, Site]]:
        return ((n, s) for n, s in self.region.nodes if type(n) is cst.Call)  # exact type: analysis/tree.py says why

    @property
    def body_env(self) -> Env:
        return self.region.body_block.env

    def finding(
        self, rule: Rule, node: cst.CSTNode, site: Site, message: str, fix: str, removable: bool | None = None, order: tuple | None = None
    ) -> Finding:
        return Finding(rule, node, site.block.module, message, fix, removable, order)

    def finding_at(
        self,
        rule: Rule,
        node: cst.CSTNode,
        module: ModuleInfo,
        message: str,
        fix: str,
        removable: bool | None = None,
        order: tuple | None = None,
    ) -> Finding:
        return Finding(rule, node, module, message, fix, removable, order)

    @cached_property
    def _order(self) -> dict[int, int]:
        return {id(n): i for i, (n, _) in enumerate(self.region.nodes)}

    def position(self, node: cst.CSTNode) -> int:
        return self._order.get(id(node), -1)

    @cached_property
    def step_positions(self) -> list[int]:
        return [i for i, (n, s) in enumerate(self.region.nodes) if is_step_op(n, s.env)]

    @cached_property
    def _optimizer_step_chains(self) -> list[tuple[int, set[int]]]:
        return optimizer_step_chains(self.region, self.position)

    @cached_property
    def first_forward_in_body(self) -> int:
        """Where the loop body first runs a model or a backward pass, itself or through a call."""
        return first_forward_position(self.region, self.position)

    def steps_optimizer(self, root: cst.CSTNode) -> bool:
        """Whether code under `root` steps or zeroes an optimizer, itself or through the functions it calls."""
        inside = {id(n) for n in iter_nodes(root)}
        return any(chain & inside for _, chain in self._optimizer_step_chains)

    def steps_optimizer_after(self, node: cst.CSTNode) -> bool:
        """Whether the loop body steps or zeroes an optimizer after `node`."""
        return any(at > self.position(node) for at, _ in self._optimizer_step_chains)

    @cached_property
    def first_gpu_position(self) -> int:
        """Where the step's GPU work starts: the first optimizer step or model call, in the order the loop
        body runs them (called functions are walked after the body, see execution_order)."""
        return min(
            (
                i
                for i, (n, s) in enumerate(self.region.nodes)
                if isinstance(n, cst.Call) and (is_step_op(n, s.env) or is_model_call(n, s.env))
            ),
            key=self.execution_order,
            default=len(self.region.nodes),
        )

    def execution_order(self, index: int, last: bool = False) -> tuple[int, int]:
        """A sort key for the region's node at `index`, in the order one iteration runs: by the loop body's
        call that leads to it (the first such call, or with `last` the last one; its own position in the
        body), then by its place in the called function."""
        return body_position(self.region, self.position, index, last), index

    def before_gpu_work(self, node: cst.CSTNode) -> bool:
        """Whether the node runs before the step's first GPU work each time the iteration runs it."""
        if self.first_gpu_position >= len(self.region.nodes):
            return True
        return self.execution_order(self.position(node), last=True) < self.execution_order(self.first_gpu_position)

    # ---- per-step host values ----------------------------------------------------------------

    @cached_property
    def counters(self) -> set[str]:
        """Host names that change every iteration: the loop's own counters (`for step in range(n)`,
        `global_step += 1` in the body) and host values computed from them there."""
        env = self.body_env
        assigned: list[tuple[str, cst.BaseExpression]] = []
        incremented: set[str] = set()
        for node, site in self.nodes():
            if site.block is not self.region.body_block:
                continue
            if isinstance(node, cst.Assign):
                assigned.extend((dotted(t.target), node.value) for t in node.targets if dotted(t.target))
            elif isinstance(node, cst.AugAssign) and dotted(node.target):
                assigned.append((dotted(node.target), node.value))
                incremented.add(dotted(node.target))
        names = {n for n in incremented if n in env.hosts}
        if isinstance(self.loop.node, cst.For):
            names.update(n.value for n in iter_nodes(self.loop.node.target) if isinstance(n, cst.Name) and n.value in env.hosts)
        changed = True
        while changed:
            changed = False
            for target, value in assigned:
                if (
                    target not in names
                    and target in env.hosts
                    and any(isinstance(n, cst.Name) and n.value in names for n in iter_nodes(value))
                ):
                    names.add(target)
                    changed = True
        return names

    @cached_property
    def loop_scope(self):
        return collect_scope(self.loop.node.body)

    def is_tensor_here(self, expr: cst.BaseExpression, site: Site) -> bool:
        """Whether an expression of the step holds a tensor where it stands: a name the loop body rebinds only
        to host values (`loss_avg = meter.avg`) holds those there, whatever the function assigns it elsewhere."""
        env = site.env
        if site.block is self.region.body_block and type(expr) is cst.Name and expr.value in env.tensors:
            verdicts = {env._tensor(v, 0) for v in self.loop_scope.values.get(expr.value, ())}
            if False in verdicts and True not in verdicts:
                return False
        return env.is_tensor(expr)

    @cached_property
    def assigned_in_loop(self) -> set[str]:
        """Names (re)bound anywhere in the loop body, the loop target included."""
        names = set(self.loop_scope.values)
        if isinstance(self.loop.node, cst.For):
            names.update(n.value for n in iter_nodes(self.loop.node.target) if isinstance(n, cst.Name))
        return names

    # ---- loop invariance ----------------------------------------------------------------------

    @cached_property
    def _changed_in_loop(self) -> tuple[set[str], set[str]]:
        """Names and attribute chains (`self.use_amp`, `args.lr`) that an iteration may rebind: the loop
        body's bindings and counters, attributes any function it reaches assigns, names those functions
        rebind through `global`."""
        names = self.counters | self.assigned_in_loop
        chains: set[str] = set()
        declared_global: set[str] = set()
        for node, _ in self.nodes():
            if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                for target in targets:
                    for part in iter_nodes(target):
                        if isinstance(part, (cst.Attribute, cst.Subscript)) and dotted(_base(part)):
                            chains.add(dotted(_base(part)))
                        elif isinstance(part, cst.Name) and part.value in declared_global:
                            names.add(part.value)
            elif isinstance(node, (cst.Global, cst.Nonlocal)):
                declared_global.update(n.name.value for n in node.names)
            elif (m := method_call(node)) is not None and m[1] in ("train", "eval") and dotted(m[0]):
                chains.add(f"{dotted(m[0])}.training")  # a mode call changes the module's flag
        return names, chains

    def is_loop_invariant(self, expr: cst.BaseExpression, env: Env | None = None, depth: int = 0) -> bool:
        """Whether an expression has one value for the whole loop: it reads no tensor values, calls only pure
        builtins and tensor metadata, and reads names and attributes nothing in the loop (nor any function
        it reaches) rebinds. A parameter of a called function is as invariant as its argument."""
        env = env or self.body_env
        if env._tensor(expr, 0) is True:
            return False
        names, chains = self._changed_in_loop
        outer_attributes = {id(n.value) for n in iter_nodes(expr) if isinstance(n, cst.Attribute)}
        for n in iter_nodes(expr):
            if isinstance(n, cst.Call) and not _pure_call(n):
                return False
            chain = dotted(n) if isinstance(n, (cst.Name, cst.Attribute)) and id(n) not in outer_attributes else None
            if chain is None:
                continue
            parts = chain.split(".")
            if parts[0] in env.bound and env is not self.body_env:
                caller, arg = env.bound[parts[0]]
                if depth > 4 or not self.is_loop_invariant(arg, caller, depth + 1):
                    return False
            elif parts[0] in names or {".".join(parts[:k]) for k in range(1, len(parts) + 1)} & chains:
                return False
        return True

    # ---- host reads -----------------------------------------------------------------------

    def statement_of(self, site: Site) -> cst.CSTNode | None:
        for a in reversed(site.ancestors):
            if isinstance(a, (cst.SimpleStatementLine, cst.If, cst.While, cst.Assert)):
                return a
        return None

    def host_read_removable(self, node: cst.CSTNode, site: Site) -> bool:
        """A host read can move after the replay unless later GPU work of the step depends on it."""
        stmt = self.statement_of(site)
        if isinstance(stmt, (cst.If, cst.While)) and self._within(node, stmt.test):
            body_nodes = list(iter_nodes(stmt.body))
            if any(isinstance(n, cst.Call) and (is_step_op(n, site.env) or is_model_call(n, site.env)) for n in body_nodes):
                return False
            leaves = any(isinstance(n, (cst.Continue, cst.Return)) for n in body_nodes)
            return not (leaves and any(p > self.position(node) for p in self.step_positions))
        if isinstance(stmt, cst.SimpleStatementLine):
            names = set()
            for small in stmt.body:
                if isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                    targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                    for t in targets:
                        names.update(n.value for n in iter_nodes(t) if isinstance(n, cst.Name))
            if names:
                start = self.position(node)
                for n, s in self.region.nodes[start + 1 :]:
                    if isinstance(n, cst.Name) and n.value in names and s.block is site.block and self._gpu_use(s):
                        return False
        return True

    @staticmethod
    def _within(node: cst.CSTNode, root: cst.CSTNode) -> bool:
        return any(n is node for n in iter_nodes(root))

    @staticmethod
    def _gpu_use(site: Site) -> bool:
        env = site.env
        for a in reversed(site.ancestors):
            if isinstance(a, (cst.SimpleStatementLine, cst.If, cst.While)):
                return False
            if isinstance(a, cst.Call):
                if is_model_call(a, env) or is_step_op(a, env) or is_torch_tensor_call(env.qualify(a.func)):
                    return True
                m = method_call(a)
                if m is not None and env.is_tensor(m[0]):
                    return True
            if isinstance(a, cst.BinaryOperation) and (env.is_tensor(a.left) or env.is_tensor(a.right)):
                return True
        return False

    # ---- objects ----------------------------------------------------------------------------

    def construction(self, expr: cst.BaseExpression, env: Env, depth: int = 0) -> tuple[cst.Call, ModuleInfo] | None:
        """The call that built the object `expr` holds: a name's assignment, a bound parameter's argument."""
        if depth > 6:
            return None
        expr = without_device_moves(expr)
        if isinstance(expr, cst.Call):
            return expr, env.module
        name = dotted(expr)
        if name is None:
            return None
        if name in env.bound:
            caller, arg = env.bound[name]
            return self.construction(arg, caller, depth + 1)
        for value in reversed(env.values_of(name)):
            found = self.construction(value, env, depth + 1)
            if found is not None:
                return found
        return None

    @cached_property
    def stepped_optimizers(self) -> list[tuple[cst.BaseExpression, Site]]:
        found = []
        for call, site in self.calls():
            if is_optimizer_step(call, site.env):
                receiver, _ = method_call(call)
                if site.env.kind_of(receiver) == SCALER:
                    if call.args:
                        found.append((call.args[0].value, site))
                else:
                    found.append((receiver, site))
        return found

    def optimizer_classes(self, expr: cst.BaseExpression, env: Env) -> Iterator[tuple[str, cst.Call, ModuleInfo]]:
        return optimizer_constructions(expr, env)

    def optimizer_class(self, expr: cst.BaseExpression, env: Env) -> tuple[str, cst.Call, ModuleInfo] | None:
        built = self.construction(expr, env)
        if built is None:
            return None
        call, module = built
        qual = module.aliases.qualify(call.func) or ""
        return qual.rsplit(".", 1)[-1], call, module

    def optimizers_take_tensor_lr(self) -> bool:
        """Whether every stepped optimizer can read a device-tensor learning rate inside a graph."""
        for expr, site in self.stepped_optimizers:
            found = self.optimizer_class(expr, site.env)
            if found is None:
                continue
            if found[0] not in ADAM_FAMILY:
                return False
        return True

    def loop_iterables(self) -> list[tuple[cst.BaseExpression, Env]]:
        """What the loop draws batches from: its iterable, and iterators advanced with next() in the step."""
        env = self.body_env
        found = []
        if isinstance(self.loop.node, cst.For):
            it = unwrap_iterable(self.loop.node.iter, env)
            if isinstance(it, cst.Call) and (env.qualify(it.func) or "") in ("enumerate", "zip") and it.args:
                found.extend((unwrap_iterable(a.value, env), env) for a in it.args)
            else:
                found.append((it, env))
        for call, site in self.calls():
            if isinstance(call.func, cst.Name) and call.func.value == "next" and call.args:
                found.append((call.args[0].value, site.env))
        return found


def _pure_call(call: cst.Call) -> bool:
    """`len(x)`, `isinstance(x, T)`, `x.size(0)`, `x.is_contiguous()`: a call that reads and changes nothing."""
    if isinstance(call.func, cst.Name):
        return call.func.value in PURE_BUILTINS
    return isinstance(call.func, cst.Attribute) and is_tensor_metadata_method(call.func.attr.value)


def _base(target: cst.BaseExpression) -> cst.BaseExpression:
    """The object an assignment changes: `self.stats` for `self.stats["loss"] = ...`."""
    return target.value if isinstance(target, cst.Subscript) else target


def is_device_arg(expr: cst.BaseExpression, env: Env, depth: int = 0) -> bool:
    """Whether an expression names an accelerator: a device string or `torch.device(...)`, a name bound to
    one (whatever it is called: `dev_ = torch.device("cuda")`), or, failing that, a name that says so."""
    if isinstance(expr, cst.SimpleString):
        return "cuda" in expr.value or "mps" in expr.value or "xpu" in expr.value
    if isinstance(expr, cst.Call):
        return (env.qualify(expr.func) or "").endswith("device")
    if isinstance(expr, cst.IfExp):  # `"cuda" if torch.cuda.is_available() else "cpu"`
        return is_device_arg(expr.body, env, depth) or is_device_arg(expr.orelse, env, depth)
    name = dotted(expr) or ""
    if depth < 4 and name and isinstance(env, Env):  # (with module aliases only, by name alone)
        bound = [env.bound[name]] if name in env.bound else [(env, v) for v in env.values_of(name)]
        if any(is_device_arg(value, where, depth + 1) for where, value in bound):
            return True
    last = name.lower().rsplit(".", 1)[-1]
    return "device" in last or last in ("dev", "rank", "local_rank", "gpu", "gpu_id")


Where = tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]  # a node, and its ancestors, as a Site holds them


def is_on_device(expr: cst.BaseExpression, env: Env, depth: int = 0, where: Where | None = None) -> bool:
    """Whether a tensor expression already lives on an accelerator: made there (`torch.randn(..., device=dev)`),
    moved there (`.to(dev)`, `.cuda()`), computed from such tensors (indexed, viewed, `torch.cat` of them, a
    model's output), or a name bound to those: by the assignment that reaches `where` in the iteration
    (`x = x.to(device)` earlier in the body), else by every binding it has. Moving it again copies nothing."""
    if depth > 12:
        return False
    if isinstance(expr, cst.Subscript):
        return is_on_device(expr.value, env, depth + 1, where)
    if isinstance(expr, cst.Call):
        return _call_on_device(expr, env, depth, where)
    name = dotted(expr) if isinstance(expr, cst.Name) else None
    if name is None:
        return False
    reaching = reaching_value(name, where) if where is not None else None
    if reaching is not None:
        return is_on_device(reaching[0], env, depth + 1, reaching[1])
    values = env.values_of(name)
    # `x = x.to(device)` says nothing of the `x` it moves (a loop target, a parameter: bindings not listed)
    rebinds_itself = any(isinstance(n, cst.Name) and n.value == name for v in values for n in iter_nodes(v))
    return bool(values) and not rebinds_itself and all(is_on_device(v, env, depth + 1) for v in values)


def _call_on_device(expr: cst.Call, env: Env, depth: int, where: Where | None) -> bool:
    device = kwarg(expr, "device")
    if device is not None:
        return is_device_arg(device, env) and not is_cpu_arg(device, env)
    if is_model_call(expr, env) and expr.args:  # a module's output lives where its parameters do
        return is_on_device(expr.args[0].value, env, depth + 1, where)
    qual = env.qualify(expr.func) or ""
    if qual in _JOINED and expr.args and isinstance(expr.args[0].value, (cst.List, cst.Tuple)):
        elements = expr.args[0].value.elements
        return bool(elements) and all(is_on_device(e.value, env, depth + 1, where) for e in elements)
    if qual.startswith("torch.") and qual.rsplit(".", 1)[-1] not in _MADE_ON_HOST and expr.args and not expr.args[0].keyword:
        return is_on_device(expr.args[0].value, env, depth + 1, where)  # `torch.sigmoid(x)`, `zeros_like(x)`: where x is
    m = method_call(expr)
    if m is None:
        return False
    if m[1] == "cuda":
        return True
    if m[1] == "to" and expr.args and expr.args[0].keyword is None:
        return is_device_arg(expr.args[0].value, env) and not is_cpu_arg(expr.args[0].value, env)
    return m[1] in _SAME_PLACE and is_on_device(m[0], env, depth + 1, where)


_SAME_PLACE = {"view", "reshape", "float", "half", "long", "int", "bool", "contiguous", "unsqueeze", "squeeze", "flatten", "permute", "t"}
_SAME_PLACE |= {"detach", "clone", "expand", "expand_as", "repeat", "transpose", "type_as", "view_as", "reshape_as"}
# torch functions that make a tensor on the host unless told a device (their first argument is no tensor)
_MADE_ON_HOST = {"tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm"}
_MADE_ON_HOST |= {"arange", "linspace", "logspace", "eye", "normal", "Tensor", "FloatTensor", "LongTensor", "asarray", "frombuffer"}
_JOINED = {"torch.cat", "torch.stack", "torch.concat", "torch.hstack", "torch.vstack"}


def reaching_value(name: str, where: Where) -> tuple[cst.BaseExpression, Where] | None:
    """The value a plain assignment gave `name` in the statement before `where` (in its block or an enclosing
    one, inside the same loop iteration and function) that last binds it, and where that statement stands;
    None when it is bound otherwise (augmented, unpacked from a call, in a loop header) or not there."""
    child, ancestors = where
    for i in range(len(ancestors) - 1, -1, -1):
        parent = ancestors[i]
        if isinstance(parent, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(parent, cst.IndentedBlock):
            at = next((k for k, stmt in enumerate(parent.body) if stmt is child), None)
            for stmt in reversed(parent.body[:at] if at is not None else ()):
                if name in names_written(stmt):
                    value = _assigned_value(stmt, name)
                    return (value, (stmt, ancestors[: i + 1])) if value is not None else None
        child = parent
    return None


def _assigned_value(stmt: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """`name = value`, or `a, name = x, value`: the value; None for anything else."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return None
    assign = stmt.body[0]
    if len(assign.targets) != 1:
        return None
    target, value = assign.targets[0].target, assign.value
    if isinstance(target, cst.Name):
        return value if target.value == name else None
    if (
        isinstance(target, (cst.Tuple, cst.List))
        and isinstance(value, (cst.Tuple, cst.List))
        and len(target.elements) == len(value.elements)
    ):
        for t, v in zip(target.elements, value.elements):
            if isinstance(t.value, cst.Name) and t.value.value == name and not isinstance(t, cst.StarredElement):
                return v.value
    return None


def is_cpu_arg(expr: cst.BaseExpression, env: Env) -> bool:
    if isinstance(expr, cst.SimpleString):
        return expr.value.strip("'\"") == "cpu"
    if isinstance(expr, cst.Call) and (env.qualify(expr.func) or "").endswith("device") and expr.args:
        return is_cpu_arg(expr.args[0].value, env)
    return False


def is_host_move(call: cst.Call, env: Env) -> bool:
    """`x.cpu()`, `x.to("cpu")`, `x.to(device="cpu")`."""
    m = method_call(call)
    return m is not None and (m[1] == "cpu" or (m[1] == "to" and bool(call.args) and is_cpu_arg(call.args[0].value, env)))


# ---- where a loop's steps run in its body: directly, or inside the functions the body calls ------


def optimizer_step_chains(region: Region, position: Callable[[cst.CSTNode], int]) -> list[tuple[int, set[int]]]:
    """Each optimizer step of the region (`opt.step()`, `scaler.step(opt)`, a loss-scaler helper, or
    `zero_grad`): where it runs in the loop body, and the ids of it and of every call leading to it."""
    chains = []
    for i, (node, site) in enumerate(region.nodes):
        if not (is_step_op(node, site.env) and not is_backward(node, site.env)) and not _is_zero_grad(node, site.env):
            continue
        calls = region.body_calls_of(site)
        chain = {id(node)} | {id(c) for c in calls}
        block = site.block
        while block.call is not None:
            chain.add(id(block.call))
            block = block.parent
        chains.append((min((position(c) for c in calls), default=i), chain))
    return chains


def first_forward_position(region: Region, position: Callable[[cst.CSTNode], int]) -> int:
    """Where the loop body first runs a model or a backward pass, itself or through a call."""
    return min(
        (
            body_position(region, position, i)
            for i, (n, s) in enumerate(region.nodes)
            if type(n) is cst.Call and (is_model_call(n, s.env) or is_backward(n, s.env))
        ),
        default=len(region.nodes),
    )


def body_position(region: Region, position: Callable[[cst.CSTNode], int], index: int, last: bool = False) -> int:
    """Where the region's node at `index` runs in the loop body: its own position there, or that of the
    body's call leading to it (the first such call, or with `last` the last one). Called functions are
    walked after the body, so their nodes' own positions say nothing of when they run."""
    calls = [position(c) for c in region.body_calls_of(region.nodes[index][1])]
    return (max if last else min)(calls, default=index)


def _is_zero_grad(node: cst.CSTNode, env: Env) -> bool:
    m = method_call(node)
    return m is not None and m[1] == "zero_grad" and env.kind_of(m[0]) in (OPTIMIZER, MODEL, SCALER)


# ---- every construction an optimizer name may hold, for rules that judge the optimizer's class and flags ---

_MAX_DEPTH = 6


def without_device_moves(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`model` of `model.to(device).cuda()`: the object a move returns is the one it was called on."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("to", "cuda"):
        expr = expr.func.value
    return expr


def optimizer_constructions(expr: cst.BaseExpression, env: Env, depth: int = 0) -> Iterator[tuple[str, cst.Call, object]]:
    """(class name, call, ModuleInfo) for each call that may have built `expr`: every assignment of a name
    (`if args.optimizer == "adamw": ... elif ...`), both arms of a conditional expression, the returns of a
    same-file builder function, and a class held in a name (`optimizer_cls = torch.optim.AdamW`)."""
    if depth > _MAX_DEPTH:
        return
    expr = without_device_moves(expr)
    if isinstance(expr, cst.IfExp):
        yield from optimizer_constructions(expr.body, env, depth + 1)
        yield from optimizer_constructions(expr.orelse, env, depth + 1)
        return
    if isinstance(expr, cst.Call):
        yield from _call_constructions(expr, env, depth)
        return
    name = dotted(expr)
    if name in env.bound:
        caller, arg = env.bound[name]
        yield from optimizer_constructions(arg, caller, depth + 1)
    elif name is not None:
        for value in env.values_of(name):
            yield from optimizer_constructions(value, env, depth + 1)


def _call_constructions(call: cst.Call, env: Env, depth: int) -> Iterator[tuple[str, cst.Call, object]]:
    qual = env.qualify(call.func) or ""
    func = call.func.value if isinstance(call.func, cst.Name) else None
    module = env.module
    if func is None or qual.rsplit(".", 1)[-1] in KNOWN_OPTIMIZERS:
        yield qual.rsplit(".", 1)[-1], call, module
        return
    if module is not None and func in module.functions and func not in env.scope.values:
        builder = module.function_info(module.functions[func], None)
        inner = builder.new_env()
        for value in (r.value for r in returns(builder.node)):
            yield from optimizer_constructions(value, inner, depth + 1)
        return
    classes = [env.qualify(v) or "" for v in env.values_of(func)] or [qual]
    for held in classes:
        yield held.rsplit(".", 1)[-1], call, module
