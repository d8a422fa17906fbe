"""`--statistics`: how many diagnostics of each rule, most frequent first.

12  GFY001  tensor-item
 3  GFY511  print-in-step
"""

from __future__ import annotations

import json
from collections import Counter

from graphify.model import Report


def counts(report: Report) -> list[tuple[str, str, int]]:
    """(code, name, count), most frequent first, then by code."""
    n = Counter(d.code for d in report.diagnostics)
    names = {d.code: d.rule.name for d in report.diagnostics}
    return sorted(((code, names[code], c) for code, c in n.items()), key=lambda t: (-t[2], t[0]))


def render(report: Report, as_json: bool = False) -> str:
    rows = counts(report)
    if as_json:
        return json.dumps([{"code": c, "name": name, "count": k} for c, name, k in rows], indent=2) + "\n"
    if not rows:
        return ""
    width = len(str(rows[0][2]))
    return "".join(f"{k:>{width}}  {c}  {name}\n" for c, name, k in rows)
