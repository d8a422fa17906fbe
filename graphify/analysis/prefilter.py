"""Cheap tests that skip files, and loops, which cannot train or infer, before libcst sees them.

Real trees are large and most files have no training loop: a regular expression drops files without
any marker, then Python's own (much faster) parser looks for a loop that steps, runs backward, calls
a function that does, or runs under no_grad/inference_mode.
"""

from __future__ import annotations

import ast
import re

from graphify.analysis.vocabulary import OPTIMIZER, kind_by_name

_MARKERS = re.compile(
    r"\.backward\s*\(|\.step\s*\(|no_grad|inference_mode|autograd\.backward|[(,]\s*(?:opt|optim|optimi[sz]er|\w+_opt|\w+_optim|\w+_optimi[sz]er)\s*[,)]"
)
_STEP_ATTRS = {"backward", "step", "manual_backward"}
_NO_GRAD = ("no_grad", "inference_mode", "set_grad_enabled")


def might_hold_loops(source: str) -> bool:
    if _MARKERS.search(source) is None:
        return False
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True  # let libcst report it
    return _Scan(tree).found


def _called_name(func: ast.AST) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _mentions_no_grad(node: ast.AST) -> bool:
    return any(
        isinstance(n, (ast.Name, ast.Attribute)) and (getattr(n, "id", None) or getattr(n, "attr", "")) in _NO_GRAD for n in ast.walk(node)
    )


def _names_optimizer(arg: ast.AST) -> bool:
    name = arg.id if isinstance(arg, ast.Name) else arg.attr if isinstance(arg, ast.Attribute) else ""
    return kind_by_name(name) == OPTIMIZER


def _steps_when_called(method: ast.AST) -> bool:
    return (
        isinstance(method, _FUNCTIONS)
        and method.name == "__call__"
        and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _STEP_ATTRS for n in ast.walk(method))
    )


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LOOPS = (ast.For, ast.While, ast.AsyncFor)


class _Scan:
    """One walk of the module. A loop is a candidate when it runs under no_grad/inference_mode (a
    `with` around it, or its function's decorator), or anything in it calls a step or backward, hands
    an optimizer to a helper (`loss_scaler(loss, optimizer)`), mentions no_grad/inference_mode, or
    calls a function of the module that steps."""

    def __init__(self, tree: ast.Module) -> None:
        self.steppers: set[str] = set()  # functions that run a step themselves (in their own code or a nested def)
        self.called_in_loops: set[str] = set()
        self.enclosing: list[str] = []  # names of the functions around the node being visited
        self.called_without_grad: set[str] = set()  # `with torch.no_grad(): evaluate(...)`
        self.with_loops: set[str] = set()  # functions holding a loop
        self.found = (
            self._visit(tree, no_grad=False, in_loop=False)
            or not self.called_in_loops.isdisjoint(self.steppers | self._stepping_objects(tree))
            or not self.called_without_grad.isdisjoint(self.with_loops)
        )

    def _stepping_objects(self, tree: ast.Module) -> set[str]:
        """Objects made of a class whose `__call__` steps (`loss_scaler = LossScaler()`): calling them steps."""
        classes = {c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and any(_steps_when_called(f) for f in c.body)}
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) in classes:
                found.update(t.id if isinstance(t, ast.Name) else t.attr for t in node.targets if isinstance(t, (ast.Name, ast.Attribute)))
        return found

    def _visit(self, node: ast.AST, no_grad: bool, in_loop: bool) -> bool:
        for child in ast.iter_child_nodes(node):
            inner, inner_loop = no_grad, in_loop
            function = isinstance(child, _FUNCTIONS)
            if function:
                inner = any(_mentions_no_grad(d) for d in child.decorator_list)
            elif isinstance(child, ast.With):
                inner = no_grad or any(_mentions_no_grad(i.context_expr) for i in child.items)
            elif isinstance(child, _LOOPS):
                if no_grad:
                    return True
                inner_loop = True
                self.with_loops.update(self.enclosing[-1:])
            elif isinstance(child, ast.Call):
                if no_grad:
                    self.called_without_grad.add(_called_name(child.func))
                if self._decides(child, inner_loop):
                    return True
            elif inner_loop and (
                isinstance(child, ast.Name) and child.id in _NO_GRAD or isinstance(child, ast.Attribute) and child.attr in _NO_GRAD
            ):
                return True
            if function:
                self.enclosing.append(child.name)
            if self._visit(child, inner, inner_loop):
                return True
            if function:
                self.enclosing.pop()
        return False

    def _decides(self, call: ast.Call, in_loop: bool) -> bool:
        func = call.func
        steps = isinstance(func, ast.Attribute) and func.attr in _STEP_ATTRS
        if not in_loop:
            if steps:
                self.steppers.update(self.enclosing)
            return False
        if steps or any(_names_optimizer(a) for a in call.args):
            return True
        self.called_in_loops.add(_called_name(func))
        return False
