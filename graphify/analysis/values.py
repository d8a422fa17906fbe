"""What names hold: tensors, host values, or well-known objects (models, optimizers, loaders...).

The inference is local and syntactic (see docs/heuristics.md). It never imports the checked code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from graphify.analysis.names import Aliases, dotted
from graphify.analysis.containers import comprehension_tensor, elements_tensor
from graphify.analysis.scope import Scope
from graphify.analysis.tree import descendants, memo, returns, simple_statements
from graphify.analysis.vocabulary import (
    ACCELERATOR,
    COLLECTIVE_HELPER,
    CONFIG_ROOTS,
    DDP,
    ENV,
    GENERATOR,
    KNOWN_OPTIMIZERS,
    LOADER,
    LOSS,
    MODEL,
    OPTIMIZER,
    SAME_ITEMS,
    SCALER,
    SCHEDULER,
    LOSS_NAME,
    is_host_method,
    is_noise_scheduler_class,
    is_tensor_metadata_attribute,
    is_torch_tensor_call,
    kind_by_name,
)

# literals, as exact types (analysis/tree.py says why)
_HOST_LITERALS = frozenset((cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))


# what `from_pretrained` also builds, besides models: classes named so
_NOT_MODELS = ("Tokenizer", "TokenizerFast", "Processor", "Config", "FeatureExtractor", "ImageProcessor", "Scheduler", "GenerationConfig")
# loss scalers that own a GradScaler: torch's own, timm's and the MAE/DeiT helpers built on it
_SCALER_CLASSES = {"GradScaler", "ShardedGradScaler", "NativeScaler", "NativeScalerWithGradNormCount"}
# factories named after what they build: `create_optimizer_v2`, `build_model`, `get_scheduler`
_FACTORY = re.compile(r"^(?:create|build|make|get|init|setup|define)_([a-z]+)(?:_v\d+)?$", re.IGNORECASE)


@dataclass
class Env:
    """Everything the inference needs for one function body: its scope, the class's `self.` attributes,
    the module's scope and imports, and the local classes."""

    scope: Scope
    module_scope: Scope
    aliases: Aliases
    class_scope: Scope | None
    module_classes: dict[str, cst.ClassDef]
    tensors: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    # Parameters bound at a call site: name -> (caller env, argument expression).
    bound: dict[str, tuple["Env", cst.BaseExpression]] = field(default_factory=dict)
    # What its call site passed into `*args` and `**kwargs`, forwarded by `f(*args, **kwargs)` to a call.
    star_bound: list[tuple["Env", cst.BaseExpression]] = field(default_factory=list)
    kwargs_bound: dict[str, tuple["Env", cst.BaseExpression]] = field(default_factory=dict)
    module: object = None  # ModuleInfo, for resolving calls into analysed functions
    func: object = None  # FunctionInfo of this body
    resolver: object = None
    gpu_calls: set[int] = field(default_factory=set)  # calls known to run a step or model (set by the rewriter)

    def values_of(self, name: str) -> list[cst.BaseExpression]:
        if name.startswith("self.") and self.class_scope is not None:
            return self.class_scope.values.get(name, [])
        if name in self.declared_global():  # `global skipped` then `skipped += 1`: the module's binding too
            return self.scope.values.get(name, []) + self.module_scope.values.get(name, [])
        return self.scope.values.get(name) or self.module_scope.values.get(name, [])

    def declared_global(self) -> frozenset[str]:
        node = getattr(self.func, "node", None)
        if node is None:
            return frozenset()
        found = _GLOBALS.get(id(node))
        if found is None or found[0] is not node:
            names = frozenset(
                n.name.value for s in simple_statements(node) for small in s.body if type(small) is cst.Global for n in small.names
            )
            found = _GLOBALS[id(node)] = (node, names)
        return found[1]

    def qualify(self, expr: cst.BaseExpression) -> str | None:
        return self.aliases.qualify(expr)

    # ---- objects --------------------------------------------------------------------------

    def kind_of(self, expr: cst.BaseExpression, depth: int = 0) -> str | None:
        """Which well-known object an expression holds, by its construction or, failing that, its name."""
        if depth > 6:
            return None
        if isinstance(expr, cst.Call):
            return self._kind_of_call(expr, depth)
        if isinstance(expr, cst.IfExp):  # `Adam(...) if fine_tune else None`
            return self.kind_of(expr.body, depth + 1) or self.kind_of(expr.orelse, depth + 1)
        if isinstance(expr, cst.Subscript):  # optimizers[0], self.models["g"]
            return self.kind_of(expr.value, depth + 1) if self._is_container_of_objects(expr.value) else None
        name = dotted(expr)
        if name is None:
            return None
        if name in self.bound:
            caller, arg = self.bound[name]
            kind = caller.kind_of(arg, depth + 1)
            if kind is not None:
                return kind
        values = self.values_of(name)
        call_kinds = {id(v): self._kind_of_call(v, depth + 1) for v in values if isinstance(v, cst.Call)}
        if DDP in call_kinds.values():
            return DDP  # `model = DDP(model, ...)`: the name holds the wrapper from there on
        for value in values:
            kind = call_kinds[id(value)] if id(value) in call_kinds else self.kind_of(value, depth + 1)
            if kind is not None:
                return kind
        if any(isinstance(v, cst.Call) and is_noise_scheduler_class(self.qualify(v.func) or "") for v in values):
            return None  # whatever its name says
        if not values and self._names_a_function(name):
            return None  # `def call_model(module, x)`: a function, whatever its name says
        return kind_by_name(name) or (MODEL if name in self._used_as_modules() else None)

    def _names_a_function(self, name: str) -> bool:
        """A function of this module, or a method of this class (`self.model_step`)."""
        module = self.module
        if module is None:
            return False
        if "." not in name:
            return name in module.functions
        owner, _, attr = name.partition(".")
        cls = getattr(self.func, "cls", None)
        return owner == "self" and cls is not None and "." not in attr and module.method(cls, attr) is not None

    def _attribute_by_name(self, name: str, depth: int) -> bool | None:
        """What an attribute chain holds by what is known of the name: inferred, a configuration's field, or
        what the class binds to `self.x`."""
        if name in self.tensors:
            return True
        if (
            name in self.hosts
            or name.split(".")[0] in CONFIG_ROOTS
            or name.startswith(("self.config.", "self.args.", "self.cfg.", "self.hparams."))
        ):
            return False
        return self._class_attribute_tensor(name, depth) if name.startswith("self.") else None

    def _class_attribute_tensor(self, name: str, depth: int) -> bool | None:
        """`self.x` of the class: a tensor when every binding the class's methods give it is one (a buffer
        `register_buffer` made, `self.x = torch.zeros(...)`); an update of itself (`self.x += 1`) keeps it."""
        values = self.class_scope.values.get(name, []) if self.class_scope is not None else []
        others = [v for v in values if not any(isinstance(n, (cst.Name, cst.Attribute)) and dotted(n) == name for n in descendants(v))]
        verdicts = {self._tensor(v, depth + 1) for v in others}
        return True if others and verdicts == {True} else None

    def _used_as_modules(self) -> set[str]:
        """Names this body uses as modules, whatever they are called: it calls `.eval()` on them (`task.eval()`
        before a validation loop), or hands their parameters, or a submodule's, to an optimizer
        (`Adam(ac.pi.parameters(), lr=pi_lr)`: `ac.pi` and `ac`)."""
        body = self.func.node if getattr(self.func, "node", None) is not None else getattr(self.module, "tree", None)
        if body is None:
            return set()
        found = _MODULE_NAMES.get(id(body))
        if found is None or found[0] is not body:
            found = _MODULE_NAMES[id(body)] = (body, self._put_in_eval_mode(body) | self._trained_by_an_optimizer(body))
        return found[1]

    @staticmethod
    def _put_in_eval_mode(body: cst.CSTNode) -> set[str]:
        names = set()
        for stmt in simple_statements(body):
            call = stmt.body[0].value if type(stmt.body[0]) is cst.Expr else None
            if type(call) is cst.Call and type(call.func) is cst.Attribute and call.func.attr.value == "eval" and not call.args:
                names.add(dotted(call.func.value))
        return names - {None}

    def _trained_by_an_optimizer(self, body: cst.CSTNode) -> set[str]:
        names = set()
        for call in (n for n in descendants(body) if type(n) is cst.Call and n.args):
            if self._kind_of_call(call, 7) != OPTIMIZER:
                continue
            for n in descendants(call.args[0].value):
                if type(n) is cst.Call and type(n.func) is cst.Attribute and n.func.attr.value in ("parameters", "named_parameters"):
                    owner = dotted(n.func.value)
                    if owner:
                        names.update({owner, owner.split(".")[0]} if not owner.startswith("self.") else {owner})
        return names - {"self"}

    def _is_container_of_objects(self, expr: cst.BaseExpression) -> bool:
        name = dotted(expr)
        return bool(name) and any(isinstance(v, (cst.List, cst.Tuple, cst.Dict)) for v in self.values_of(name))

    def _kind_of_call(self, call: cst.Call, depth: int) -> str | None:
        qual = self.qualify(call.func) or ""
        if is_noise_scheduler_class(qual):
            return None
        last = qual.rsplit(".", 1)[-1]
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in {
            "to",
            "cuda",
            "train",
            "eval",
            "float",
            "half",
            "bfloat16",
            "double",
        }:
            inner = self.kind_of(call.func.value, depth + 1)
            return inner if inner in (MODEL, DDP, LOSS) else None  # `GANLoss().to(device)` is still a loss
        if qual in {"torch.compile"} and call.args:
            return self.kind_of(call.args[0].value, depth + 1)
        if last in {"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP"}:
            return DDP
        if last == "DataParallel":
            return MODEL
        if last in KNOWN_OPTIMIZERS or ".optim." in f".{qual}." and last[:1].isupper() and "lr_scheduler" not in qual:
            return OPTIMIZER
        if "lr_scheduler" in qual or last.endswith(("LR", "Scheduler")) or re.match(r"get_\w*schedule", last):
            return SCHEDULER
        if last in _SCALER_CLASSES:
            return SCALER
        if last == "DataLoader":
            return LOADER
        if last == "Generator" and qual.startswith("torch"):
            return GENERATOR
        if last == "Accelerator":
            return ACCELERATOR
        if last.endswith("Loss") and (qual.startswith("torch.nn") or last != qual):
            return LOSS
        if qual.startswith("torch.nn.") and last[:1].isupper() and not qual.startswith("torch.nn.functional"):
            return MODEL
        factory = _FACTORY.match(last)
        if factory is not None and kind_by_name(factory.group(1)) in (MODEL, OPTIMIZER, SCHEDULER, SCALER, LOADER):
            return kind_by_name(factory.group(1))  # create_optimizer_v2(...), build_model(cfg)
        if any(part.endswith(_NOT_MODELS) for part in qual.split(".")[-2:]):
            return None  # AutoTokenizer.from_pretrained(...), BertConfig(...): no model
        if qual.startswith(("torchvision.models", "timm.models.", "timm.task.", "transformers.")) or qual == "timm.create_model":
            return MODEL
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "from_pretrained":
            return MODEL
        cls = self.module_classes.get(last) if "." not in qual else None
        if cls is not None and is_module_class(cls, self.module_classes):
            return MODEL
        if "gym.make" in qual or qual.endswith(".make") and "gym" in qual:
            return ENV
        return None

    # ---- tensors --------------------------------------------------------------------------

    def is_tensor(self, expr: cst.BaseExpression) -> bool:
        return self._tensor(expr, 0) is True

    def is_host(self, expr: cst.BaseExpression) -> bool:
        return self._tensor(expr, 0) is False

    def name_tensor(self, name: str) -> bool | None:
        """What a name holds: True a tensor, False a host value, None unknown."""
        if name in self.tensors:
            return True
        if name in self.hosts or name in {"True", "False", "None"}:
            return False
        return None

    def _tensor(self, expr: cst.BaseExpression, depth: int) -> bool | None:  # noqa: C901 (one case per kind of expression)
        """True: holds a tensor; False: a host value; None: unknown."""
        if depth > 12:
            return None
        if type(expr) in _HOST_LITERALS:
            return False
        if type(expr) is cst.Dict:  # a dict of tensors holds tensors, as a loss dict does
            return self._any_tensor([e.value for e in expr.elements], depth)
        if type(expr) is cst.DictComp:
            return comprehension_tensor(self, expr, expr.value, depth)
        if isinstance(expr, cst.Name):
            return self.name_tensor(expr.value)
        if isinstance(expr, cst.Attribute):
            if is_tensor_metadata_attribute(expr.attr.value):
                return False
            name = dotted(expr)
            by_name = self._attribute_by_name(name, depth) if name else None
            if by_name is not None:
                return by_name
            if expr.attr.value in {"grad", "data", "T", "mT", "H", "real", "imag", "logits", "loss", "last_hidden_state"}:
                return True if self._tensor(expr.value, depth + 1) or expr.attr.value in {"grad", "logits"} else None
            receiver = self._tensor(expr.value, depth + 1)
            if receiver is False:
                return False  # an attribute of a host value: `x.device.type`, `args.lr`
            return True if receiver is True and self.kind_of(expr.value) is None else None
        if isinstance(expr, cst.Subscript):
            return self._item_tensor(expr, depth)
        if isinstance(expr, cst.BinaryOperation):
            sides = (self._tensor(expr.left, depth + 1), self._tensor(expr.right, depth + 1))
            if True in sides:
                return True
            return False if sides == (False, False) else None
        if isinstance(expr, cst.UnaryOperation):
            if isinstance(expr.operator, cst.Not):
                inner = self._tensor(expr.expression, depth + 1)
                return None if inner is None else inner
            return self._tensor(expr.expression, depth + 1)
        if isinstance(expr, cst.Comparison):
            parts = [self._tensor(expr.left, depth + 1)] + [self._tensor(c.comparator, depth + 1) for c in expr.comparisons]
            if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in expr.comparisons):
                return False
            return True if True in parts else (False if all(p is False for p in parts) else None)
        if isinstance(expr, cst.BooleanOperation):
            sides = (self._tensor(expr.left, depth + 1), self._tensor(expr.right, depth + 1))
            return True if True in sides else (False if sides == (False, False) else None)
        if isinstance(expr, cst.IfExp):
            sides = (self._tensor(expr.body, depth + 1), self._tensor(expr.orelse, depth + 1))
            return True if True in sides else None
        if isinstance(expr, cst.Call):
            return self._call_tensor(expr, depth)
        return None

    def _call_tensor(self, call: cst.Call, depth: int) -> bool | None:
        func = call.func
        if isinstance(func, cst.Name) and func.value in {
            "float",
            "int",
            "bool",
            "len",
            "str",
            "repr",
            "round",
            "abs",
            "range",
            "enumerate",
            "isinstance",
            "math",
        }:
            return False if func.value != "abs" else self._tensor(call.args[0].value, depth + 1) if call.args else None
        if isinstance(func, cst.Name) and func.value == "next":  # what the iterator yields: a batch, unless known
            return (self._yields(call.args[0].value, [], depth + 1) if call.args else None) is not False
        if isinstance(func, cst.Name) and func.value in SAME_ITEMS and call.args:
            # the same items in another container: tensors if one of them holds one, host if all are host
            return self._any_tensor([a.value for a in call.args if a.keyword is None], depth)
        qual = self.qualify(func)
        if qual in ("sum", "min", "max"):
            if len(call.args) == 1:  # sum(losses), sum(d.values()), max(x for x in ...): what the iterable yields
                return elements_tensor(self, call.args[0].value, depth + 1)
            return self._any_tensor([a.value for a in call.args], depth) if call.args else None
        if qual and qual.startswith(("numpy.", "math.", "random.", "time.")):
            return False
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if is_host_method(method):
                return False
            if method == "step":  # optimizer.step(closure) returns the closure's loss
                kind = self.kind_of(func.value)
                if kind in (OPTIMIZER, SCHEDULER, SCALER, ENV):
                    return True if call.args and kind == OPTIMIZER else False
            kind = self.kind_of(func.value)
            if kind in (MODEL, DDP, LOSS):
                # model(x), model.generate(...) give tensors; model.to(device), model.state_dict() do not
                return True if method in {"forward", "__call__", "generate", "encode", "decode", "sample"} else False
            if kind in (OPTIMIZER, SCHEDULER, SCALER, LOADER, GENERATOR, ACCELERATOR) and method not in ("step", "scale"):
                return False
            receiver = self._tensor(func.value, depth + 1)
            if receiver is True:
                return True
        if is_torch_tensor_call(qual):
            return True
        kind = self.kind_of(func)
        if kind in (MODEL, DDP, LOSS):
            return True
        if kind is None and isinstance(func, (cst.Name, cst.Attribute)) and LOSS_NAME.match(dotted(func) or ""):
            return True
        if isinstance(func, cst.Name) and self.module is not None and func.value in self.module.functions:
            return self._returns_tensor(self.module.functions[func.value], depth + 1)
        method = self._local_method(func)
        if method is not None:
            return self._returns_tensor(method, depth + 1)
        last = (qual or dotted(func) or "").rsplit(".", 1)[-1]
        if COLLECTIVE_HELPER.search(last) and call.args and not (qual or "").startswith("torch."):
            return True if self._tensor(call.args[0].value, depth + 1) is True else None
        return None

    def _item_tensor(self, expr: cst.Subscript, depth: int) -> bool | None:
        """An item of a tensor is a tensor, of a shape a host number; a part of `next(it)` what `it` yields."""
        drawn = self._drawn_item(expr, depth)
        if drawn is not None:
            return drawn
        base = self._tensor(expr.value, depth + 1)
        if base is True:
            return True
        if isinstance(expr.value, cst.Attribute) and expr.value.attr.value == "shape":
            return False
        return base

    def _drawn_item(self, expr: cst.Subscript, depth: int) -> bool | None:
        """A part of what `next(it)` draws, by what `it` yields: `i, (x, y) = next(it)` over
        `iter(enumerate(loader))` binds a host index and two tensors, as the `for` loop it replaces would."""
        path: list[int] = []
        while isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
            index = expr.slice[0].slice.value
            if not isinstance(index, cst.Integer):
                return None
            path.insert(0, int(index.value))
            expr = expr.value
        if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "next" and expr.args):
            return None
        return self._yields(expr.args[0].value, path, depth + 1)

    def _yields(self, iterable: cst.BaseExpression, path: list[int], depth: int) -> bool | None:
        """Whether the part at `path` of an item of `iterable` is a tensor (True), a host value (False), or unknown."""
        if depth > 8:
            return None
        if isinstance(iterable, cst.Name) and not (self.bound.get(iterable.value)):
            values = self.values_of(iterable.value)
            return self._yields(values[0], path, depth + 1) if len(values) == 1 else None
        if not isinstance(iterable, cst.Call):
            return None
        name = (self.qualify(iterable.func) or "").rsplit(".", 1)[-1]
        args = [a.value for a in iterable.args if a.keyword is None]
        if name in ("iter", "tqdm") and args:
            return self._yields(args[0], path, depth + 1)
        if name in ("range", "count"):
            return False
        if name == "enumerate" and args and path:
            return False if path[0] == 0 else self._yields(args[0], path[1:], depth + 1)
        if name == "zip" and path and path[0] < len(args):
            return self._yields(args[path[0]], path[1:], depth + 1)
        return None

    def _any_tensor(self, parts: list[cst.BaseExpression], depth: int) -> bool | None:
        """Several values together (a dict's values, `max(a, b)`): tensors if one is, host if all are."""
        verdicts = {self._tensor(p, depth + 1) for p in parts}
        return True if True in verdicts else (False if verdicts <= {False} else None)

    def _local_method(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
        """`runner.step` where `runner = LocalClass(...)`, or `self.training_step` in a method: that class's method."""
        if self.module is None or not isinstance(func, cst.Attribute):
            return None
        owner = dotted(func.value)
        cls = getattr(self.func, "cls", None)
        if owner == "self" and cls is not None:
            return self.module.method(cls, func.attr.value)
        for value in self.values_of(owner) if owner else ():
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in self.module.classes:
                return self.module.method(self.module.classes[value.func.value], func.attr.value)
        return None

    def _returns_tensor(self, fn: cst.FunctionDef, depth: int) -> bool | None:
        """A local helper such as `get_batch()` returns tensors if one of its return values is a tensor."""
        if depth > 3:
            return None
        memo = self.module.__dict__.setdefault("_returns_tensor_memo", {})
        if id(fn) in memo:
            return memo[id(fn)]
        memo[id(fn)] = None  # a helper that (indirectly) calls itself: unknown
        cls = next((c for c in self.module.classes.values() if any(s is fn for s in c.body.body)), None)
        info = self.module.function_info(fn, cls)
        env = info.new_env()
        env.infer({}, info.scope, depth + 1)
        verdicts = set()
        for node in returns(fn):
            value = node.value
            parts = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
            verdicts.update(env._tensor(p, depth + 1) for p in parts)
        memo[id(fn)] = True if True in verdicts else (False if verdicts == {False} else None)
        return memo[id(fn)]

    def infer(self, seeds: dict[str, bool], local: Scope, depth: int = 0) -> None:
        """Fixed-point over the assignments of `local`, seeded with known tensor/host names. `depth`
        bounds the inference through helpers' return values (recursive helpers must terminate)."""
        for name, is_tensor in seeds.items():
            (self.tensors if is_tensor else self.hosts).add(name)
        bindings = dict(local.values)
        for name in self.declared_global():  # bound at module level too: `global step` then `step += 1`
            bindings[name] = bindings.get(name, []) + self.module_scope.values.get(name, [])
        for _ in range(6):
            changed = False
            for name, values in bindings.items():
                for value in values:
                    verdict = self._tensor(value, depth)
                    if verdict is True and name not in self.tensors:
                        self.tensors.add(name)
                        self.hosts.discard(name)
                        changed = True
                    elif verdict is False and name not in self.tensors and name not in self.hosts:
                        self.hosts.add(name)
                        changed = True
            if not changed:
                break


_MODULE_NAMES: dict[int, tuple[cst.CSTNode, set[str]]] = memo()  # body id -> (body, names it uses as modules)
_GLOBALS: dict[int, tuple[cst.CSTNode, frozenset[str]]] = memo()


def is_module_class(cls: cst.ClassDef, classes: dict[str, cst.ClassDef], depth: int = 0) -> bool:
    for base in cls.bases:
        name = dotted(base.value) or ""
        last = name.rsplit(".", 1)[-1]
        if last in {"Module", "Sequential", "ModuleList", "LightningModule", "PreTrainedModel"}:
            return True
        if depth < 4 and last in classes and classes[last] is not cls and is_module_class(classes[last], classes, depth + 1):
            return True
    return False
