"""The rule factory and the categories rules belong to; every rule module makes its RULE with it."""

from graphify.model import Fix, Rule, Severity

CATEGORIES = (
    "host-sync",
    "data-dependent-branch",
    "in-loop-allocation",
    "cross-device",
    "dynamic-shape",
    "non-capturable-optimizer",
    "lr-scheduler",
    "amp-grad-scaler",
    "host-branch",
    "logging-io",
    "rng",
    "distributed",
    "rewrite-safety",
)


def rule(code: str, name: str, category: str, severity: str, summary: str, rewritable: bool, fix: Fix = Fix()) -> Rule:
    assert category in CATEGORIES, category
    return Rule(code, name, category, Severity(severity), summary, rewritable, fix)
