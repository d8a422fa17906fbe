"""How a rewritten file gets the runtime: imported from graphify.runtime (the default), imported from
one copy written for a project (`--runtime vendor`), or pasted into the file (`--runtime inline`), the
last two for code that must not depend on graphify being installed.

The bundle is built from graphify/runtime/ itself, so it is always the runtime this graphify runs:
its modules in dependency order, their imports hoisted and deduplicated, the imports between them
dropped. It starts and ends with a marker line naming the runtime version; the version tells a stale
copy apart (`graphify rewrite --runtime vendor` rewrites an older copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, ImportItem

from graphify.analysis.names import code_text
from graphify.analysis.rewritten import INLINE_FUNCTION
from graphify.rewrite.deferred import DEFERRED_READS

RUNTIME_CLASSES = ("CapturedStep", "GraphedModule", "build_on_capture_stream")  # what rewritten files use

RUNTIME_DIR = Path(__file__).resolve().parents[1] / "runtime"
_ORDER = (
    "common",
    "host_values",
    "optimizer_settings",
    "distributed",
    "reach",
    "states",
    "gradients",
    "staging",
    "captured_step",
    "graphed_module",
)  # each imports only those before it
BEGIN = "# --- graphify runtime {version}: pasted by `graphify rewrite --runtime inline`; do not edit ---"
END = "# --- end of graphify runtime {version} ---"
VENDOR_HEADER = '"""graphify runtime {version}, written by `graphify rewrite --runtime vendor`; do not edit (rerun to update)."""'


def runtime_version() -> str:
    for line in (RUNTIME_DIR / "__init__.py").read_text(encoding="utf-8").splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise RuntimeError("graphify/runtime/__init__.py has no __version__")


@cache
def _parts(deferred: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the import statements the runtime needs, the code of its modules without them); with `deferred`,
    DeferredReads too (--defer-host-reads), which a file pasted a runtime into has only where it uses it."""
    imports: list[str] = []
    bodies: list[str] = []
    for name in _ORDER + (("deferred",) if deferred else ()):
        module = cst.parse_module((RUNTIME_DIR / f"{name}.py").read_text(encoding="utf-8"))
        for i, stmt in enumerate(module.body):
            code = module.code_for_node(stmt)
            small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) else None
            if i == 0 and isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString):
                continue  # the module docstring
            if isinstance(small, (cst.Import, cst.ImportFrom)):
                target = module.code_for_node(small.module) if isinstance(small, cst.ImportFrom) and small.module else ""
                if target != "__future__" and not target.startswith("graphify"):
                    line = code.strip() + "\n"
                    if line not in imports:
                        imports.append(line)
                continue
            bodies.append(code)
    return tuple(imports), tuple(bodies)


@dataclass(frozen=True)
class RuntimeChoice:
    mode: str = "import"  # "import" | "vendor" | "inline"
    module: str = "graphify.runtime"  # what "import" and "vendor" import from


def bound_runtime_names(tree: cst.Module) -> dict[str, str]:
    """Runtime classes the file has already: class name -> its name in the file. Recognised by the
    statement that binds them: an import of `CapturedStep`/`GraphedModule` from any module (the package
    or a vendored copy), or the assignment from a pasted runtime."""
    found = {}
    for stmt in tree.body:
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    name = code_text(alias.name)
                    if name in (*RUNTIME_CLASSES, DEFERRED_READS):
                        found[name] = alias.asname.name.value if alias.asname else name
            elif _is_inline_binding(small):
                for name, element in zip((*RUNTIME_CLASSES, DEFERRED_READS), small.targets[0].target.elements):
                    found[name] = element.value.value
    return found


def _is_inline_binding(small: cst.BaseSmallStatement) -> bool:
    return (
        isinstance(small, cst.Assign)
        and isinstance(small.value, cst.Call)
        and isinstance(small.value.func, cst.Name)
        and small.value.func.value == INLINE_FUNCTION
        and isinstance(small.targets[0].target, cst.Tuple)
    )


class _UnindentedBlankLines(cst.CSTTransformer):
    """Blank lines of the pasted runtime stay empty once it is indented into its function."""

    def leave_EmptyLine(self, original, updated):
        return updated if updated.comment else updated.with_changes(indent=False, whitespace=cst.SimpleWhitespace(""))


def runtime_header(choice: RuntimeChoice, names: dict[str, str], new: list[str]) -> list[cst.BaseStatement]:
    """With --runtime inline, the statements that bring the runtime classes `new` into a file under `names`
    (the pasted runtime); an import is added by with_runtime_imports."""
    if not new or choice.mode != "inline":
        return []
    version = runtime_version()
    classes = (*RUNTIME_CLASSES, DEFERRED_READS) if DEFERRED_READS in new else RUNTIME_CLASSES
    imports, bodies = _parts(DEFERRED_READS in new)
    code = "".join(imports) + "".join(bodies) + f"return {', '.join(classes)}\n"
    inner = cst.parse_module(code).visit(_UnindentedBlankLines()).body
    function = cst.FunctionDef(
        name=cst.Name(INLINE_FUNCTION),
        params=cst.Parameters(),
        body=cst.IndentedBlock(body=inner),
        leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(comment=cst.Comment(BEGIN.format(version=version)))],
    )
    bound = ", ".join(names[c] for c in classes)
    binding = cst.parse_statement(f"{bound} = {INLINE_FUNCTION}()  {END.format(version=version)}\n")
    return [function, binding.with_changes(leading_lines=[cst.EmptyLine(indent=False)])]


def with_runtime_imports(tree: cst.Module, choice: RuntimeChoice, names: dict[str, str], new: list[str]) -> cst.Module:
    """`tree` importing the runtime classes `new` under `names` from the package or a vendored copy, as
    libcst's AddImportsVisitor adds imports: after the module docstring and `from __future__` imports, at
    the end of the file's leading imports (added to an import from the same module there), never twice."""
    if not new or choice.mode == "inline":
        return tree
    wanted = [ImportItem(choice.module, name, None if names[name] == name else names[name]) for name in new]
    return tree.visit(AddImportsVisitor(CodemodContext(), wanted))


def vendor_code() -> str:
    """The runtime as a module of its own."""
    imports, bodies = _parts(deferred=True)
    body = "".join(b if b.startswith("\n") else "\n" + b for b in bodies)
    header = VENDOR_HEADER.format(version=runtime_version())
    return f"{header}\n\nfrom __future__ import annotations\n\n{''.join(imports)}\n{body.rstrip()}\n"
