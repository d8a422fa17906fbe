"""Import aliases and dotted names: `F.relu` -> `torch.nn.functional.relu`."""

from __future__ import annotations

import libcst as cst

from graphify.analysis.vocabulary import MODULE_RETURNS_SELF


_EMPTY_MODULE = cst.Module([])


def code_text(node: cst.CSTNode) -> str:
    """A node's code as the source writes it."""
    return _EMPTY_MODULE.code_for_node(node)


def dotted(expr: cst.BaseExpression) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while type(expr) is cst.Attribute:  # exact types: analysis/tree.py says why
        parts.append(expr.attr.value)
        expr = expr.value
    if type(expr) is cst.Name:
        parts.append(expr.value)
        return ".".join(reversed(parts))
    return None


def class_made(value: cst.BaseExpression, classes) -> str | None:
    """`Net` for `Net()`, `Net().to(device).eval()` (nn.Module's self-returning methods keep the module),
    when `Net` is one of `classes`; else None."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in MODULE_RETURNS_SELF:
        value = value.func.value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in classes:
        return value.func.value
    return None


def _module_name(node: cst.BaseExpression | None) -> str:
    return dotted(node) if node is not None else ""


class Aliases:
    """Maps local names bound by imports to the dotted name they stand for."""

    # Conventional aliases, used when a script relies on an import we did not see (notebooks, star imports).
    DEFAULTS = {
        "torch": "torch",
        "nn": "torch.nn",
        "F": "torch.nn.functional",
        "optim": "torch.optim",
        "dist": "torch.distributed",
        "np": "numpy",
        "amp": "torch.amp",
    }

    def __init__(self) -> None:
        self.map: dict[str, str] = dict(self.DEFAULTS)
        # `from .steps import train_step` -> local name -> (module, level, name)
        self.from_imports: dict[str, tuple[str, int, str]] = {}

    def add(self, node: cst.Import | cst.ImportFrom) -> None:
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = dotted(alias.name) or ""
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self.map[alias.asname.name.value] = full
                else:
                    head = full.split(".")[0]
                    self.map[head] = head
            return
        if isinstance(node.names, cst.ImportStar):
            return
        module = _module_name(node.module)
        level = len(node.relative)
        for alias in node.names:
            name = dotted(alias.name) or ""
            local = alias.asname.name.value if alias.asname is not None and isinstance(alias.asname.name, cst.Name) else name
            self.map[local] = f"{module}.{name}" if module and not level else name
            self.from_imports[local] = (module, level, name)

    def qualify(self, expr: cst.BaseExpression) -> str | None:
        name = dotted(expr)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        full = self.map.get(head)
        if full is None:
            return name
        return f"{full}.{rest}" if rest else full
