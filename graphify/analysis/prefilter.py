"""Cheap tests that skip files, and loops, which cannot train or infer, before libcst sees them.

Real trees are large and most files have no training loop: a regular expression drops files without
any marker, then Python's own (much faster) parser looks for a loop that steps, runs backward, calls
a function that does, or runs under no_grad/inference_mode.
"""

from __future__ import annotations

import ast
import re
from functools import cached_property

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


def _calls_step(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _STEP_ATTRS for n in ast.walk(node))


def _mentions_no_grad(node: ast.AST) -> bool:
    return any(
        isinstance(n, (ast.Name, ast.Attribute)) and (getattr(n, "id", None) or getattr(n, "attr", "")) in _NO_GRAD for n in ast.walk(node)
    )


def _names_optimizer(arg: ast.AST) -> bool:
    name = arg.id if isinstance(arg, ast.Name) else arg.attr if isinstance(arg, ast.Attribute) else ""
    return kind_by_name(name) == OPTIMIZER


class _Scan:
    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.found = self._visit(tree, no_grad=False)

    @cached_property
    def steppers(self) -> set[str]:
        """Functions that run a step themselves: a loop calling one of them may be a training loop."""
        return {n.name for n in ast.walk(self.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _calls_step(n)}

    def _visit(self, node: ast.AST, no_grad: bool) -> bool:
        for child in ast.iter_child_nodes(node):
            inner = no_grad
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = any(_mentions_no_grad(d) for d in child.decorator_list)
            elif isinstance(child, ast.With):
                inner = no_grad or any(_mentions_no_grad(i.context_expr) for i in child.items)
            elif isinstance(child, (ast.For, ast.While, ast.AsyncFor)) and self._candidate(child, no_grad):
                return True
            if self._visit(child, inner):
                return True
        return False

    def _candidate(self, loop: ast.AST, no_grad: bool) -> bool:
        """One walk of the loop: a step or backward call, no_grad/inference_mode, a helper handed the
        optimizer (`loss_scaler(loss, optimizer)`), or a call of a function that steps."""
        if no_grad:
            return True
        called = set()
        for n in ast.walk(loop):
            if isinstance(n, ast.Call):
                func = n.func
                if isinstance(func, ast.Attribute) and func.attr in _STEP_ATTRS:
                    return True
                if any(_names_optimizer(a) for a in n.args):
                    return True
                called.add(func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None)
            elif isinstance(n, ast.Name) and n.id in _NO_GRAD or isinstance(n, ast.Attribute) and n.attr in _NO_GRAD:
                return True
        return bool(called & self.steppers)
