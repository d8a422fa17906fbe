"""Plain data shared by the analysis core, the rewriter and the reporters."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from enum import Enum


class Severity(str, Enum):
    ERROR = "error"  # capture fails, or replays silently wrong
    WARNING = "warning"  # capture works, but speed or semantics suffer
    INFO = "info"


class Verdict(str, Enum):
    CAPTURABLE = "capturable"
    AFTER_REWRITE = "capturable-after-rewrite"
    # the model's forward and backward only, or a step beside which a sync or collective stays eager
    PARTIAL = "partially-capturable"
    NOT_CAPTURABLE = "not-capturable"
    ALREADY_CAPTURED = "already-captured"  # the script captures or replays this loop's step itself


class FixKind(str, Enum):
    """What `graphify rewrite` does about a rule's finding where its context allows (the plan acts on these)."""

    IN_PLACE = "fixed where it stands"  # `capturable=True`, `drop_last=True`, a tensor learning rate, a keyed early exit
    MOVED_AFTER = "moved after the replay"  # a host read, log or save of the step's results: read from its static outputs
    DRAWN = "built before each replay"  # a tensor from host data: evaluated ahead, copied into a static input
    ON_DEVICE = "built on the device"  # a host tensor copied to the device: its factory gets `device=`, else drawn ahead
    STATIC_INPUT = "copied into the static input"  # CapturedStep moves host inputs to the device: the copy a no-op
    FETCHED = "fetched before each replay"  # batches taken and host draws made ahead of the replay, in order
    EAGER = "left eager between replays"  # GPU work under a step-counter condition: a loop of its own
    SIDE_STREAM = "built on a side stream"  # a DDP model: constructed on a side stream, warmed up before capture
    REFUSED = "refused"  # the rewrite leaves the loop as written


class Applicability(str, Enum):
    """How far the rewrite's fix can be trusted (as ruff's Applicability)."""

    SAFE = "safe"  # the rewritten step computes what the written one did
    GUARDED = "guarded"  # only with what the runtime checks as it runs (warmup steps, a fallback to eager)
    NONE = "none"  # no fix: the user changes the code


class Partial(str, Enum):
    """A finding outside the models' forward, beside a partial capture (the models alone graphed)."""

    EAGER = "eager"  # runs eagerly where it stands
    UNLESS_UNREAD = "unless unread"  # blocks it, unless no graphed model reads what it makes
    NEVER = "never"  # blocks it


@dataclass(frozen=True)
class Fix:
    """A rule's fix descriptor: what the rewrite does about its findings, and how safe that is."""

    kind: FixKind = FixKind.REFUSED
    applicability: Applicability = Applicability.NONE
    partial: Partial = Partial.EAGER
    advice: str | None = None  # the fix told where the planner refuses a loop for this rule


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    category: str
    severity: Severity
    summary: str
    # A mechanical rewrite can remove this breaker (static buffers, tensor LR, eager host code...).
    # Individual diagnostics may still be marked not removable when their context defeats the rewrite.
    rewritable: bool
    fix: Fix = Fix()


@dataclass(frozen=True)
class Related:
    """Another place a diagnostic concerns: for a breaker inside a function the loop calls, the flagged
    code itself, while the diagnostic stands at the call in the loop."""

    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    message: str  # "in `get_batch`": what the place is


@dataclass
class Diagnostic:
    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    rule: Rule
    message: str
    fix: str
    loop_path: str
    loop_line: int
    removable_by_rewrite: bool
    # the flagged code when it stands in a function the loop calls (the diagnostic is at that call)
    related: tuple[Related, ...] = ()
    # every loop it concerns, as (path, line), the first being loop_path/loop_line: a breaker shared by
    # loops (a DataLoader or DDP model built once, a helper's line) is reported once
    loops: tuple[tuple[str, int], ...] = ()

    @property
    def code(self) -> str:
        return self.rule.code

    @property
    def affected_loops(self) -> tuple[tuple[str, int], ...]:
        return self.loops or ((self.loop_path, self.loop_line),)

    def flagged(self) -> list[tuple[str, int]]:
        """Where the flagged code stands, as (path, line): the helper's lines for a diagnostic told at a
        call in the loop, else its own."""
        return [(r.path, r.line) for r in self.related] or [(self.path, self.line)]

    def sort_key(self) -> tuple:
        return (self.path, self.line, self.column, self.rule.code)


@dataclass
class LoopReport:
    path: str
    line: int
    end_line: int
    kind: str  # "train" | "inference"
    function: str | None
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)


@dataclass
class FileError:
    path: str
    message: str


@dataclass
class Report:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    loops: list[LoopReport] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    files_checked: int = 0
    # Notebooks: the module line where each code cell begins, by path (lines are the joined module's).
    cell_starts: dict[str, list[int]] = field(default_factory=dict)

    def extend(self, other: "Report") -> None:
        self.diagnostics.extend(other.diagnostics)
        self.loops.extend(other.loops)
        self.errors.extend(other.errors)
        self.files_checked += other.files_checked
        self.cell_starts.update(other.cell_starts)

    def locate(self, path: str, line: int) -> tuple[int | None, int]:
        """(cell number from 1, line in that cell) in a notebook; (None, line) in a script."""
        starts = self.cell_starts.get(path)
        if not starts:
            return None, line
        cell = max(bisect.bisect_right(starts, line) - 1, 0)
        return cell + 1, line - starts[cell] + 1

    def where(self, path: str, line: int) -> str:
        """`path:line`, or ruff's `path:cell N:line` in a notebook."""
        cell, line = self.locate(path, line)
        return f"{path}:{line}" if cell is None else f"{path}:cell {cell}:{line}"
