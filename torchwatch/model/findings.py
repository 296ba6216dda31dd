"""What the diagnosis says: a verdict, the findings behind it and the rules it could not evaluate.

Made by :mod:`torchwatch.analysis.diagnosis`, carried by the
:class:`~torchwatch.model.observation.Observation`, shown by every face.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torchwatch.model.predicted import Predicted


@dataclass(frozen=True)
class Fix:
    """A change to make: what (title) and to what, why (detail).

    Attributes:
        trial: ``SETTING=VALUE`` when the fix can be tried on the running training
            (``torchwatch trial PID SETTING=VALUE``, or ``t`` in the TUI), else ``None``.
        predicted: the speed-up the fix should buy (:mod:`torchwatch.analysis.predict`), or
            ``None`` where nothing predicted it (a fix built outside the diagnosis, an older report).
    """

    title: str
    detail: str
    trial: str | None = None
    predicted: Predicted | None = None

    def to_json(self) -> dict[str, Any]:
        """The fix as ``{"title", "detail"}``, with ``"trial"`` when it can be tried live and
        ``"predicted"`` (:meth:`Predicted.to_json`) when it was predicted."""
        d: dict[str, Any] = {"title": self.title, "detail": self.detail}
        if self.trial:
            d["trial"] = self.trial
        if self.predicted is not None:
            d["predicted"] = self.predicted.to_json()
        return d


@dataclass(frozen=True)
class Finding:
    """A rule that fired: its label, severity, explained share, evidence and fixes."""

    rule: str
    label: str
    severity: str
    summary: str
    measure: float | None
    evidence: dict[str, float | None]
    fixes: tuple[Fix, ...]
    source: str
    scope: str = "loop"  # the rule's: loop, machine (others hold the CPUs) or demand (see rules_engine.SCOPES)

    def to_json(self) -> dict[str, Any]:
        """The finding as in the report contract (evidence rounded to 4 digits)."""
        return {
            "rule": self.rule,
            "label": self.label,
            "severity": self.severity,
            "summary": self.summary,
            "evidence": {k: _round(v) for k, v in self.evidence.items()},
            "fixes": [f.to_json() for f in self.fixes],
            "source": self.source,
        }


@dataclass(frozen=True)
class NotApplicable:
    """A rule that could not be evaluated: the missing feature and why it is missing."""

    rule: str
    missing: str
    why: str

    def to_json(self) -> dict[str, str]:
        """``{"rule", "missing", "why"}``."""
        return {"rule": self.rule, "missing": self.missing, "why": self.why}


@dataclass(frozen=True)
class Verdict:
    """The label, a confidence 0..1 and one sentence; ``waiting_for``: before the training's first
    step, what it does instead (``importing torch``; no label is given until then), else ``None``."""

    label: str
    confidence: float
    summary: str
    waiting_for: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"label", "confidence", "summary"}`` (confidence rounded to 2 digits)."""
        return {"label": self.label, "confidence": round(self.confidence, 2), "summary": self.summary}


def _round(v: float | None) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return round(v, 4)
