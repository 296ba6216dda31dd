"""Busy-machine test helpers: the findings a rule set settles on for given features."""

from __future__ import annotations

from tests.unit.rules import RULES, features
from torchwatch.analysis.diagnosis import Diagnoser


def _settled(rule_ids: list[str], **values: float) -> tuple[list[str], str, float]:
    d = Diagnoser([RULES[r] for r in rule_ids])
    f = features(**values)
    d.evaluate(f, 0.0)
    a = d.evaluate(f, 10.0)
    return [x.rule for x in a.findings], a.verdict.label, a.verdict.confidence
