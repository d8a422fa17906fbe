"""Parsed modules of the checked tree, their functions and classes, and sibling-module resolution."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property

import libcst as cst
from libcst.metadata import CodeRange

from graphify.analysis.names import Aliases, dotted
from graphify.analysis.positions import Positions
from graphify.analysis.tree import children, descendants, nested_too_deep
from graphify.analysis.scope import Scope, collect_scope, forget_before_conversions
from graphify.analysis.values import Env


@dataclass
class FunctionInfo:
    module: "ModuleInfo"
    node: cst.FunctionDef | None  # None: module-level code
    cls: cst.ClassDef | None
    qualname: str | None

    @cached_property
    def scope(self) -> Scope:
        node = self.node if self.node is not None else self.module.tree
        scope = collect_scope(node)
        forget_before_conversions(scope, node.body if self.node is None else getattr(node.body, "body", ()))
        return scope

    @property
    def class_scope(self) -> Scope | None:
        return self.module.class_scope(self.cls) if self.cls is not None else None

    def new_env(self) -> Env:
        return Env(
            scope=self.scope,
            module_scope=self.module.scope,
            aliases=self.module.aliases,
            class_scope=self.class_scope,
            module_classes=self.module.classes,
            module=self.module,
            func=self,
            resolver=self.module.program,
        )

    @property
    def params(self) -> list[str]:
        if self.node is None:
            return []
        p = self.node.params
        return [x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)]

    @property
    def positional_params(self) -> list[str]:
        if self.node is None:
            return []
        p = self.node.params
        return [x.name.value for x in (*p.posonly_params, *p.params)]

    @property
    def star_params(self) -> tuple[str | None, str | None]:
        """The names of `*args` and `**kwargs`, where the function has them."""
        if self.node is None:
            return None, None
        p = self.node.params
        star = p.star_arg.name.value if isinstance(p.star_arg, cst.Param) else None
        return star, p.star_kwarg.name.value if p.star_kwarg is not None else None


class ModuleInfo:
    def __init__(self, path: str, source: str, tree: cst.Module, program: "Program") -> None:
        self.path = path
        self.source = source
        self.tree = tree
        self.program = program
        self.aliases = Aliases()
        self.functions: dict[str, cst.FunctionDef] = {}
        self.classes: dict[str, cst.ClassDef] = {}
        self._function_infos: dict[int, FunctionInfo] = {}
        self._class_scopes: dict[int, Scope] = {}
        for stmt in tree.body:
            self._index(stmt)
        # a class defined in a function (`def main(): class Net(nn.Module): ...`) is followed like a module's,
        # unless its name is taken or defined twice: its forward is read, not trusted
        local = [c for f in self.functions.values() for c in _classes_defined_in(f)]
        names = [c.name.value for c in local]
        for cls in local:
            if names.count(cls.name.value) == 1:
                self.classes.setdefault(cls.name.value, cls)

    def _index(self, stmt: cst.CSTNode) -> None:
        if isinstance(stmt, cst.FunctionDef):
            self.functions[stmt.name.value] = stmt
        elif isinstance(stmt, cst.ClassDef):
            self.classes[stmt.name.value] = stmt
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    self.aliases.add(small)
        elif isinstance(stmt, (cst.If, cst.Try)):  # guarded imports and definitions
            for child in stmt.body.body:
                self._index(child)

    @cached_property
    def scope(self) -> Scope:
        scope = Scope()
        for stmt in self.tree.body:
            if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                collect_scope(stmt, scope)
        forget_before_conversions(scope, self.tree.body)
        return scope

    def class_scope(self, cls: cst.ClassDef) -> Scope:
        """`self.x = ...` assignments of all the class's methods (one scope per class)."""
        scope = self._class_scopes.get(id(cls))
        if scope is None:
            scope = self._class_scopes[id(cls)] = Scope()
            for stmt in cls.body.body:
                if isinstance(stmt, cst.FunctionDef):
                    collect_scope(stmt, scope)
                    _bind_registered_buffers(stmt, scope)
        return scope

    @cached_property
    def names(self) -> set[str]:
        """Every identifier in the module; the rewrite adds the names it introduces."""
        found, stack = set(), [self.tree]
        while stack:
            n = stack.pop()
            if isinstance(n, cst.Name):
                found.add(n.value)
            stack.extend(children(n))
        return found

    @cached_property
    def positions(self) -> Positions:
        # Only modules that hold a reported loop or a called function pay for positions.
        return Positions(self.tree)

    def position(self, node: cst.CSTNode) -> CodeRange:
        return self.positions[node]

    def function_info(self, node: cst.FunctionDef | None, cls: cst.ClassDef | None) -> FunctionInfo:
        key = id(node) if node is not None else 0
        info = self._function_infos.get(key)
        if info is None:
            if node is None:
                qual = None
            else:
                qual = f"{cls.name.value}.{node.name.value}" if cls is not None else node.name.value
            info = FunctionInfo(self, node, cls, qual)
            self._function_infos[key] = info
        return info

    def method(self, cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
        for stmt in cls.body.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                return stmt
        for base in cls.bases:  # methods inherited from a local base class
            base_name = getattr(base.value, "value", None)
            if isinstance(base_name, str) and base_name in self.classes and self.classes[base_name] is not cls:
                found = self.method(self.classes[base_name], name)
                if found is not None:
                    return found
        return None

    def imported_module(self, local_name: str) -> tuple["ModuleInfo", str] | None:
        """The sibling module that `from X import local_name` refers to, and the imported name."""
        entry = self.aliases.from_imports.get(local_name)
        if entry is None:
            return None
        module, level, name = entry
        base = os.path.dirname(self.path) or "."
        for _ in range(max(level - 1, 0)):
            base = os.path.dirname(base) or "."
        rel = module.replace(".", os.sep) if module else ""
        candidates = [os.path.join(base, rel + ".py"), os.path.join(base, rel, "__init__.py")] if rel else []
        if not module and level:
            candidates.append(os.path.join(base, name + ".py"))
        for candidate in candidates:
            info = self.program.load(candidate)
            if info is not None:
                return info, name
        return None


@dataclass
class Program:
    """Modules parsed so far; sibling modules are parsed on demand when a loop calls into them."""

    modules: dict[str, ModuleInfo | None] = field(default_factory=dict)

    def add(self, path: str, source: str, tree: cst.Module) -> ModuleInfo:
        info = ModuleInfo(path, source, tree, self)
        self.modules[os.path.normpath(path)] = info
        return info

    def load(self, path: str) -> ModuleInfo | None:
        key = os.path.normpath(path)
        if key in self.modules:
            return self.modules[key]
        self.modules[key] = None
        try:
            if os.path.getsize(path) > 2_000_000:
                return None
            with open(path, encoding="utf-8") as f:
                source = f.read()
            if nested_too_deep(source):
                return None
            tree = cst.parse_module(source)
        except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
            return None
        return self.add(path, source, tree)


def _bind_registered_buffers(method: cst.FunctionDef, scope: Scope) -> None:
    """`self.register_buffer("initialized", torch.tensor(0))` binds `self.initialized` to that tensor."""
    for n in descendants(method):
        if not (
            isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in ("register_buffer", "register_parameter")
        ):
            continue
        if dotted(n.func.value) == "self" and len(n.args) >= 2 and isinstance(n.args[0].value, cst.SimpleString):
            scope.add(f"self.{n.args[0].value.evaluated_value}", n.args[1].value)


def _classes_defined_in(func: cst.FunctionDef) -> list[cst.ClassDef]:
    """Classes defined in a function's body, or in blocks of it (`if`, `with`, `try`), not in nested functions."""
    found, stack = [], list(func.body.body) if isinstance(func.body, cst.IndentedBlock) else []
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, cst.ClassDef):
            found.append(stmt)
        elif isinstance(stmt, (cst.If, cst.With, cst.Try, cst.For, cst.While)) and isinstance(stmt.body, cst.IndentedBlock):
            stack.extend(stmt.body.body)
    return found
