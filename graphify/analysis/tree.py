"""Fast child access: libcst computes `node.children` with a visitor on every call, and the analysis
walks the same small trees many times, so children are memoised per node while a module is analysed."""

from __future__ import annotations

import libcst as cst

_CACHE: dict[int, tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]] = {}


def children(node: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
    hit = _CACHE.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    kids = tuple(node.children)
    _CACHE[id(node)] = (node, kids)
    return kids


def forget() -> None:
    """Drop the memo (between modules), so a long run does not keep old trees alive."""
    _CACHE.clear()
