"""What one iteration of a loop runs: the loop body and the bodies of the functions it calls."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from graphify.analysis.program import FunctionInfo, ModuleInfo
from graphify.analysis.values import Env


@dataclass
class Block:
    """Statements run by one iteration: the loop body, or the body of a function it calls."""

    func: FunctionInfo
    env: Env
    stmts: list[cst.CSTNode]
    call: cst.Call | None = None  # the call that entered this function; None for the loop body
    parent: "Block | None" = None  # the block holding that call

    @property
    def module(self) -> ModuleInfo:
        return self.func.module


@dataclass
class Site:
    block: Block
    ancestors: tuple[cst.CSTNode, ...]  # from the block's statements down to the node's parent

    @property
    def env(self) -> Env:
        return self.block.env


@dataclass
class Region:
    loop: cst.For | cst.While
    func: FunctionInfo
    nodes: list[tuple[cst.CSTNode, Site]] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    # a function called from several places is walked once, from its first call: id of the function's
    # node -> its later calls, each with where it stands
    repeats: dict[int, list[tuple[cst.Call, Site]]] = field(default_factory=dict)

    @property
    def body_block(self) -> Block:
        return self.blocks[0]

    def body_call_of(self, site: Site) -> cst.Call | None:
        """For a node inside a called function, the call in the loop body that leads to it."""
        block = site.block
        while block.parent is not None and block.parent is not self.body_block:
            block = block.parent
        return block.call if block.parent is self.body_block else None

    def body_calls_of(self, site: Site) -> list[cst.Call]:
        """For a node inside a called function, every call in the loop body that leads to it: the first
        one, and those that reach the same function (or a function between) again."""
        return [call for call, block in self._calls_on_the_way(site) if block is self.body_block]

    def calls_leading_to(self, site: Site) -> set[int]:
        """ids of every call, at any depth, whose function (or one it calls) holds the node at `site`:
        the call that entered each block on the way up, and the later calls of functions walked once."""
        return {id(call) for call, _ in self._calls_on_the_way(site)}

    def _calls_on_the_way(self, site: Site):
        """(call, the block it stands in) for each call from the loop body down to `site`'s block: the call
        that entered each block on the way up, and the later calls of each function walked once."""
        seen, pending = set(), [site]
        while pending:
            block = pending.pop().block
            while block is not None and block is not self.body_block:
                if id(block.func.node) not in seen:
                    seen.add(id(block.func.node))
                    for call, call_site in self.repeats.get(id(block.func.node), []):
                        yield call, call_site.block
                        pending.append(call_site)
                yield block.call, block.parent
                block = block.parent


@dataclass
class Loop:
    node: cst.For | cst.While
    func: FunctionInfo
    kind: str  # "train" | "inference"
    region: Region
    ancestors: tuple[cst.CSTNode, ...] = ()  # enclosing nodes in the module, outermost first
    by_hand: bool = False  # a warmup or replay loop of a CUDA graph the script captures itself

    @property
    def module(self) -> ModuleInfo:
        return self.func.module

    @property
    def outer_loops(self) -> list[cst.For | cst.While]:
        """The loops around this one in its own function, outermost first (an epoch loop)."""
        inside: list[cst.For | cst.While] = []
        for a in reversed(self.ancestors):
            if isinstance(a, (cst.FunctionDef, cst.ClassDef)):
                break
            if isinstance(a, (cst.For, cst.While)):
                inside.append(a)
        return inside[::-1]
