"""The speed-up a fix should buy, as :mod:`torchwatch.analysis.predict` predicts it.

Carried by a :class:`~torchwatch.model.findings.Fix` (``Fix.predicted``), written in the JSON
report under the fix (``"predicted"``) and shown by the text report as ``≈ 2.1× (1.7–2.5×)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Predicted:
    """The predicted ratio of steps/s after the fix to steps/s now, or why there is none.

    Attributes:
        kind: the model that predicted it (``num_workers``, ``threads``, ``pin_memory``,
            ``neighbour``, ``quota``, ``cache``, ``sleep``), or ``none`` when no model applies.
        ratio: steps/s after / steps/s now (> 1: faster), rounded to 3 digits; ``None``: not predicted.
        low, high: the ratio's interval (about 90 %: the readings' sampling spread and the
            model's own error, :data:`torchwatch.analysis.predict.MODEL_ERROR`); ``None`` with ``ratio``.
        reason: when ``ratio`` is ``None``, why the model cannot predict it; else the assumption the
            prediction rests on most (one phrase).
        knee: for ``num_workers`` only, the fewest DataLoader workers within 5 % of the best rate
            the model predicts on the usable CPUs; else ``None``.
    """

    kind: str
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    reason: str = ""
    knee: int | None = None

    def text(self) -> str:
        """``≈ 2.1× (1.7–2.5×)`` (with ``, knee num_workers=3`` for a worker count), or
        ``not predicted: REASON``."""
        if self.ratio is None or self.low is None or self.high is None:
            return f"not predicted: {self.reason}"
        shown = f"≈ {_x(self.ratio)}× ({_x(self.low)}–{_x(self.high)}×)"
        if self.knee is not None:
            shown += f", knee num_workers={self.knee}"
        return shown

    def to_json(self) -> dict[str, Any]:
        """``{"kind", "ratio", "low", "high", "reason"}`` and ``"knee"`` when known."""
        d: dict[str, Any] = {
            "kind": self.kind,
            "ratio": self.ratio,
            "low": self.low,
            "high": self.high,
            "reason": self.reason,
        }
        if self.knee is not None:
            d["knee"] = self.knee
        return d


def _x(v: float) -> str:
    """A ratio with 2 significant figures below 10 (``0.74``, ``2.1``), whole above."""
    if v >= 10:
        return f"{v:.0f}"
    return f"{v:.2f}" if v < 1 else f"{v:.1f}"
