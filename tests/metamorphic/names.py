"""Consistent, scope-safe renames of the variables that hold a script's model, device, optimizer, loader, loss..."""

from __future__ import annotations

import ast
import builtins

from .registry import transformation
from .script import Script, dotted, innermost_call, is_method_call, script

OPTIMIZERS = {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "LBFGS", "SparseAdam"}


def _renamable(s: Script, name: str) -> bool:
    """Only a variable of module or function scopes: not a builtin, an imported name, a function, a class or a
    class attribute, not declared global, nor a name also passed as a keyword argument (a renamed parameter
    would break that call)."""
    if name in vars(builtins):
        return False
    for node in s.nodes:
        if isinstance(node, ast.keyword) and node.arg == name:
            return False
        if isinstance(node, ast.alias) and (node.asname or node.name.split(".")[0]) == name:
            return False
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return False
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return False
        if isinstance(node, ast.ClassDef) and name in _class_bindings(node):
            return False
    return True


def _class_bindings(cls: ast.ClassDef) -> set[str]:
    """Names bound in a class body itself (its attributes), not in its methods."""
    bound = set()
    for stmt in cls.body:
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.update(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return bound


def _uses(s: Script, name: str) -> list[tuple[int, int]]:
    """The byte spans of every use and binding of a variable: names and parameters."""
    spans = [s.span(n) for n in s.of(ast.Name) if n.id == name]
    spans += [(start, start + len(name.encode())) for start in (s.offset(a.lineno, a.col_offset) for a in s.of(ast.arg) if a.arg == name)]
    return spans


def rename(source: str, mapping: dict[str, str]) -> str | None:
    """The source with each name of `mapping` renamed, skipping names that are not safe to rename; None when
    nothing was renamed or a new name is already in use."""
    s = script(source)
    if any(new in s.identifiers for new in mapping.values()):
        return None
    edits = []
    for old, new in mapping.items():
        if not _renamable(s, old):
            continue
        spans = _uses(s, old)
        if any(s.data[a:b].decode() != old for a, b in spans):  # a position ast reports wrongly (inside an f-string)
            return None
        edits += [(a, b, new) for a, b in spans]
    return s.edit(edits)


def _bound_to(s: Script, makes) -> list[str]:
    """Names assigned from a call (or a method chain starting with one) whose callee `makes` accepts, in order."""
    names = []
    for assign in s.of(ast.Assign):
        call = innermost_call(assign.value)
        callee = dotted(call.func) if call is not None else None
        if callee is None or not makes(callee):
            continue
        names += [t.id for t in assign.targets if isinstance(t, ast.Name) and t.id not in names]
    return names


def _rename_all(source: str, names: list[str], base: str) -> str | None:
    return rename(source, {old: f"{base}{i + 1 if i else ''}_" for i, old in enumerate(names)}) if names else None


def _module_classes(s: Script) -> set[str]:
    """Classes of the file that subclass a torch module (`nn.Module`, `torch.nn.Module`, or one of these classes)."""
    found: set[str] = set()
    classes = s.of(ast.ClassDef)
    for _ in classes:
        for cls in classes:
            if any((dotted(b) or "").endswith("Module") or dotted(b) in found for b in cls.bases):
                found.add(cls.name)
    return found


def _makes_model(s: Script):
    local = _module_classes(s)

    def makes(callee: str) -> bool:
        last = callee.rsplit(".", 1)[-1]
        return callee in local or (callee.startswith(("nn.", "torch.nn.")) and last[:1].isupper() and not last.endswith("Loss"))

    return makes


@transformation
def rename_model(source: str) -> str | None:
    """Renames every variable bound to a model (an instance of one of the file's modules or of an `nn` layer) to `net_`, `net2_`..."""
    s = script(source)
    return _rename_all(source, _bound_to(s, _makes_model(s)), "net")


@transformation
def rename_device(source: str) -> str | None:
    """Renames every variable bound to `torch.device(...)` to `dev_`, `dev2_`..."""
    return _rename_all(source, _bound_to(script(source), lambda callee: callee.endswith(".device")), "dev")


@transformation
def rename_optimizer(source: str) -> str | None:
    """Renames every variable bound to a torch optimizer to `opt_`, `opt2_`..."""
    return _rename_all(source, _bound_to(script(source), lambda callee: callee.rsplit(".", 1)[-1] in OPTIMIZERS), "opt")


@transformation
def rename_loader(source: str) -> str | None:
    """Renames every variable bound to a `DataLoader(...)` to `batches_`, `batches2_`..."""
    return _rename_all(source, _bound_to(script(source), lambda callee: callee.rsplit(".", 1)[-1] == "DataLoader"), "batches")


@transformation
def rename_criterion(source: str) -> str | None:
    """Renames every variable bound to a loss module (`nn.CrossEntropyLoss()`...) to `crit_`, `crit2_`..."""
    return _rename_all(source, _bound_to(script(source), lambda callee: callee.rsplit(".", 1)[-1].endswith("Loss")), "crit")


@transformation
def rename_loss(source: str) -> str | None:
    """Renames every variable that a `.backward()` is called on (the loss) to `objective_`, `objective2_`..."""
    calls = [c for c in script(source).of(ast.Call) if is_method_call(c, "backward") and isinstance(c.func.value, ast.Name)]
    return _rename_all(source, list(dict.fromkeys(c.func.value.id for c in calls)), "objective")


@transformation
def rename_counter(source: str) -> str | None:
    """Renames the index variables of `for i, item in enumerate(...)` loops to `k_`, `k2_`..."""
    names = [
        loop.target.elts[0].id
        for loop in script(source).of(ast.For)
        if isinstance(loop.target, ast.Tuple)
        and isinstance(loop.target.elts[0], ast.Name)
        and isinstance(loop.iter, ast.Call)
        and dotted(loop.iter.func) == "enumerate"
    ]
    return _rename_all(source, list(dict.fromkeys(names)), "k")
