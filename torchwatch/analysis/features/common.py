"""Small numeric helpers the feature families share."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable


def _share(counter: Counter[str], key: str, total: int) -> float | None:
    return counter[key] / total if total else None


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _pct_share(values: Iterable[float | None]) -> float | None:
    """Mean of percentages as a share 0..1 (GPM readings can stray a little outside 0..100)."""
    mean = _mean(values)
    return None if mean is None else max(0.0, min(1.0, mean / 100.0))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)
