"""Rule test helpers: the shipped rules by id, and a feature set with every catalogue feature (None unless given)."""

from __future__ import annotations

from tests.unit.featuresets import consistent
from torchwatch.analysis.features import CATALOGUE, Features
from torchwatch.analysis.rules_engine import load_rules

RULES = {r.id: r for r in load_rules()}


ENOUGH = {"stack_samples": 100.0, "thread_samples": 50.0}


def features(**values: float | None) -> Features:
    f: Features = {name: None for name in CATALOGUE}
    f.update(ENOUGH)
    for name, value in consistent(values).items():
        assert name in CATALOGUE, name
        f[name] = value
    return f
