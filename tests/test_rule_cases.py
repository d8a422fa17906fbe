"""Flagged and clean forms of rule patterns that a doc example does not cover, each rule's `CASES` (in its
module): each flagged case reports its code on the line marked `# here`, each removed by the rewrite or
each not as the case expects, and each clean case reports it nowhere. The line is where the flagged code stands: in a
function the loop calls, the helper's line (the diagnostic itself stands at the call)."""

import textwrap

import pytest

import graphify.rules
from graphify.config import Settings
from graphify.engine import analyze_source

_HEADER = """\
import os, random, shutil
import timm.scheduler, timm.utils
import numpy as np
import torch
import torchvision
import torch.nn as nn
from accelerate import Accelerator
from torchvision.utils import save_image
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
accelerator = Accelerator()
"""


def _all_cases() -> dict[str, tuple[str, str, str, bool]]:
    cases = {}
    for unit in graphify.rules.units():
        for name, (flagged, clean, removed) in getattr(unit, "CASES", {}).items():
            cases[f"{unit.RULE.code}-{name}"] = (unit.RULE.code, flagged, clean, removed)
    return cases


ALL_CASES = _all_cases()


def _diagnostics(code: str, body: str) -> list:
    report = analyze_source(_HEADER + textwrap.dedent(body), "case.py", Settings(select=["ALL"]))
    return [d for d in report.diagnostics if d.code == code]


def _lines(diagnostics) -> set[int]:
    offset = len(_HEADER.splitlines()) + 1  # body line i (from 0) is source line offset + i
    return {line - offset for d in diagnostics for _, line in d.flagged()}  # where the flagged code stands


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_flagged(name):
    code, flagged, _, removed = ALL_CASES[name]
    marked = {i for i, line in enumerate(textwrap.dedent(flagged).splitlines()) if line.endswith("# here")}
    found = _diagnostics(code, flagged)
    assert _lines(found) == marked
    assert {d.removable_by_rewrite for d in found} == {removed}, "the rewrite's fix is not the one the case expects"
    assert not removed or graphify.rules.rules_by_code()[code].rewritable


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_clean(name):
    code, _, clean, _ = ALL_CASES[name]
    assert _lines(_diagnostics(code, clean)) == set()
