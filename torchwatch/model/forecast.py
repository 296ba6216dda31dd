"""When memory that grows reaches its limit: a robust trend, and a time with its interval.

Standard library only; used for host memory (the watched tree's cgroup, or the machine) and for
device memory (the training's CUDA caching allocator).

How a trend is called real (every condition must hold, over the points since the last reset):

1. **Upper envelope.** Points are bucketed into :data:`BUCKET_S` buckets and each bucket keeps its
   highest value: a garbage collection or a freed batch dips between two peaks, and what reaches a
   limit is the peaks.
2. **Resets end the window.** A fall between two buckets larger than :data:`RESET_SHARE` of the
   range seen (DataLoader workers that exit at an epoch's end, a cache emptied) starts the window
   again after it: a saw-tooth of epochs is not one long rise.
3. **The longest window that holds.** Windows of :data:`WINDOWS_S` ending at the newest reading
   are tried longest first (a long window is a more exact slope); the first whose rise meets 3-6
   is used, so a start-up ramp minutes ago leaves the recent windows free to show a trend.
   **Long enough.** At least :data:`MIN_SPAN_S` and :data:`MIN_POINTS` buckets after the reset.
4. **Significant.** The Theil-Sen slope (the median of the pairwise slopes: Sen 1968) with its
   95 % interval from Kendall's S (Gilbert 1987, "Statistical Methods for Environmental Pollution
   Monitoring", 16.5): the interval's lower end is above zero. Memory readings are
   autocorrelated, so this interval alone is too narrow; hence 5 and 6.
5. **Still rising at the same pace.** The slopes of the window's first and second halves are
   both positive and within a factor :data:`HALVES_RATIO` of each other: a start-up ramp that
   levels off (model load, workers forking, an allocator warming its cache) fails here, because
   its second half is flatter.
6. **Large enough to matter.** The rise over the window is at least :data:`MIN_RISE_BYTES` and
   :data:`MIN_RISE_SHARE` of the limit: the drift of a few MiB a long training shows is not a
   leak worth a warning.

The time left is ``(limit - level) / slope`` where the level is the latest bucket's peak; its
interval comes from the slope's interval (a slower slope gives the later end). A forecast longer
than :data:`HORIZON_S` is not shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BUCKET_S",
    "HORIZON_S",
    "MIN_SPAN_S",
    "Forecast",
    "Trend",
    "best_trend",
    "envelope",
    "forecast",
    "theil_sen",
    "trend",
]

BUCKET_S = 5.0
"""Seconds per bucket of the upper envelope: longer than a GC pause or a batch's life, short enough
that a 60 s window has 12 points."""
MIN_SPAN_S = 60.0
"""Seconds a rise must be seen for before it is called a trend (the issue asks for a forecast at
least 60 s before a kill; a shorter span cannot tell a ramp from a trend: condition 5)."""
MIN_POINTS = 6
"""Buckets a trend needs at least (a tree of large processes has its private memory read every
5-10 s: 6-12 points in 60 s)."""
RESET_SHARE = 0.25
"""A fall of more than this share of the window's range between two buckets is a reset."""
HALVES_RATIO = 2.5
"""Most the two halves' slopes may differ by (a factor) for a steady rise. A rise that levels off
exponentially with time constant tau passes only if tau > 0.55 x the span (ratio exp(span/2tau))."""
MIN_RISE_BYTES = 32 * (1 << 20)
MIN_RISE_SHARE = 0.01
HORIZON_S = 24 * 3600.0
Z95 = 1.959964
MAX_POINTS = 240
"""Buckets kept for the fit (20 min at 5 s): Theil-Sen is O(n^2), 240 points are 28,680 pairs (~6 ms
in CPython, done every few seconds)."""


@dataclass(frozen=True)
class Trend:
    """A robust straight-line fit of a rise.

    Attributes:
        slope: Theil-Sen slope, units per s (bytes/s for memory). lo / hi: its 95 % interval.
        first_half / second_half: the slopes of the two halves of the window.
        start / end: the window's first and last bucket, s (the caller's clock).
        level: the last bucket's peak (units). rise: slope x span (units).
        points: buckets in the window.
        real: every condition of the module docstring holds. why: the first that fails
            (``""`` when real).
    """

    slope: float
    lo: float
    hi: float
    first_half: float
    second_half: float
    start: float
    end: float
    level: float
    rise: float
    points: int
    real: bool
    why: str


@dataclass(frozen=True)
class Forecast:
    """When a rising quantity reaches its limit.

    Attributes:
        seconds: time left at the fitted slope, s. soonest / latest: its 95 % interval, s
            (``latest`` is ``math.inf`` when the slope's interval reaches zero).
        limit: the limit, units. level: the latest peak, units. slope: units per s.
        trend: the fit behind it.
    """

    seconds: float
    soonest: float
    latest: float
    limit: float
    level: float
    slope: float
    trend: Trend


def envelope(points: Sequence[tuple[float, float]], bucket_s: float = BUCKET_S) -> list[tuple[float, float]]:
    """The upper envelope: ``(bucket end, highest value)`` per ``bucket_s`` bucket, oldest first.

    Args:
        points: ``(t s, value)`` in time order. bucket_s: bucket length, s (> 0).
    Returns:
        at most :data:`MAX_POINTS` buckets (the newest). Empty buckets are skipped.
    """
    out: list[tuple[float, float]] = []
    if not points:
        return out
    t0 = points[0][0]
    cur_idx = -1
    for t, v in points:
        idx = int((t - t0) // bucket_s)
        if idx != cur_idx:
            out.append((t, v))
            cur_idx = idx
        elif v > out[-1][1]:
            out[-1] = (t, v)  # the bucket's time is its peak's
    return out[-MAX_POINTS:]


def theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """Theil-Sen slope with its 95 % interval (Sen's method, Kendall's S variance without ties).

    Args:
        points: ``(x, y)``, at least 2 with distinct x.
    Returns:
        ``(slope, lo, hi)`` in y units per x unit.
    Raises:
        ValueError: fewer than 2 points with distinct x.
    """
    slopes: list[float] = []
    n = len(points)
    for i in range(n):
        xi, yi = points[i]
        for j in range(i + 1, n):
            xj, yj = points[j]
            if xj != xi:
                slopes.append((yj - yi) / (xj - xi))
    if not slopes:
        raise ValueError("Theil-Sen needs two points with different x")
    slopes.sort()
    m = len(slopes)
    mid = m // 2
    slope = slopes[mid] if m % 2 else 0.5 * (slopes[mid - 1] + slopes[mid])
    var_s = n * (n - 1) * (2 * n + 5) / 18.0
    c = Z95 * math.sqrt(var_s)
    lo_i = math.floor((m - c) / 2.0)
    hi_i = math.ceil((m + c) / 2.0)
    lo = slopes[max(0, min(m - 1, lo_i))]
    hi = slopes[max(0, min(m - 1, hi_i))]
    return slope, lo, hi


def _since_reset(env: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(env) < 2:
        return env
    values = [v for _, v in env]
    span = max(values) - min(values)
    if span <= 0:
        return env
    start = 0
    for i in range(1, len(env)):
        if env[i - 1][1] - env[i][1] > RESET_SHARE * span:
            start = i
    return env[start:]


def trend(points: Sequence[tuple[float, float]], limit: float | None = None) -> Trend | None:
    """Fit the rise of ``points`` and decide whether it is real (module docstring, 1-6).

    Args:
        points: ``(t s, value)`` readings in time order (any rate; bucketed here).
        limit: the limit the values grow toward (units), for condition 6's share; ``None``: the
            byte threshold only.
    Returns:
        the fit, or ``None`` when fewer than 3 buckets remain after the last reset.
    """
    env = _since_reset(_thin(envelope(points)))
    if len(env) < 3:
        return None
    return _fit(env, limit)


def _fit(env: list[tuple[float, float]], limit: float | None) -> Trend:
    """Conditions 3-6 of the module docstring over an envelope already cut at its last reset."""
    slope, lo, hi = theil_sen(env)
    half = len(env) // 2
    first = theil_sen(env[: half + 1])[0] if half >= 1 else slope
    second = theil_sen(env[half:])[0] if len(env) - half >= 2 else slope
    start, end = env[0][0], env[-1][0]
    span = end - start
    rise = slope * span
    need = max(float(MIN_RISE_BYTES), MIN_RISE_SHARE * limit if limit else 0.0)
    why = ""
    if span < MIN_SPAN_S or len(env) < MIN_POINTS:
        why = f"{span:.0f} s of steady readings since the last reset, {MIN_SPAN_S:.0f} s needed"
    elif lo <= 0:
        why = "no significant rise (the slope's 95 % interval reaches zero)"
    elif first <= 0 or second <= 0 or max(first, second) > HALVES_RATIO * min(first, second):
        why = "the rise does not keep its pace (the window's halves differ)"
    elif rise < need:
        why = f"the rise ({rise / (1 << 20):.0f} MiB) is below {need / (1 << 20):.0f} MiB"
    return Trend(slope, lo, hi, first, second, start, end, env[-1][1], rise, len(env), not why, why)


WINDOWS_S = (1200.0, 960.0, 720.0, 480.0, 360.0, 240.0, 180.0, 120.0, 90.0, 60.0)
"""The windows tried, longest first, each ending at the newest reading: the longest whose rise is
real is used (a start-up ramp minutes ago fails the long windows and leaves the recent ones)."""
FIT_POINTS = 120
"""Most buckets one fit uses: a longer window's buckets are merged in pairs (their peak) until it
fits (120 points: 7,140 pairs, ~3 ms)."""


def _thin(env: list[tuple[float, float]]) -> list[tuple[float, float]]:
    while len(env) > FIT_POINTS:
        env = [max(env[i : i + 2], key=lambda p: p[1]) for i in range(0, len(env), 2)]
    return env


def _cheap_reject(env: list[tuple[float, float]], need: float) -> bool:
    """A least-squares slope that is not positive, or a rise below ``need``: no Theil-Sen needed
    (an O(n) pre-check; the flat series of most trainings stop here)."""
    n = len(env)
    mx = sum(t for t, _ in env) / n
    my = sum(v for _, v in env) / n
    sxx = sum((t - mx) ** 2 for t, _ in env)
    if sxx <= 0:
        return True
    slope = sum((t - mx) * (v - my) for t, v in env) / sxx
    return slope <= 0 or slope * (env[-1][0] - env[0][0]) < 0.5 * need


def best_trend(points: Sequence[tuple[float, float]], limit: float | None = None) -> Trend | None:
    """The fit over the longest of :data:`WINDOWS_S` whose rise is real; when none is, the fit
    over the shortest window that has points (its ``why`` says what fails); ``None`` without
    3 buckets."""
    env_all = envelope(points)
    if len(env_all) < 3:
        return None
    end = env_all[-1][0]
    need = max(float(MIN_RISE_BYTES), MIN_RISE_SHARE * limit if limit else 0.0)
    last: Trend | None = None
    tried: set[int] = set()
    for w in WINDOWS_S:
        env = [p for p in env_all if p[0] >= end - w]
        if len(env) in tried or len(env) < 3:
            continue
        tried.add(len(env))
        env = _since_reset(_thin(env))
        if len(env) < 3:
            continue
        if _cheap_reject(env, need):
            continue
        tr = _fit(env, limit)
        if tr.real:
            return tr
        last = tr
    if last is not None:
        return last
    return trend(points[-int(MIN_SPAN_S * 4) :], limit) if points else None


def forecast(points: Sequence[tuple[float, float]], limit: float | None) -> Forecast | None:
    """The time until ``points`` reach ``limit``, only when a rise is real (:func:`best_trend`)
    and the limit is reached within :data:`HORIZON_S`.

    Args:
        points: ``(t s, value)`` in time order. limit: the limit in the values' units; ``None``
            or not above the level: no forecast (a value already at its limit is the pressure
            rules' business, not a forecast's).
    Returns:
        the forecast, or ``None``.
    """
    if limit is None or limit <= 0:
        return None
    tr = best_trend(points, limit)
    if tr is None or not tr.real:
        return None
    left = limit - tr.level
    if left <= 0:
        return None
    seconds = left / tr.slope
    if seconds > HORIZON_S:
        return None
    soonest = left / tr.hi if tr.hi > 0 else seconds
    latest = left / tr.lo if tr.lo > 0 else math.inf
    return Forecast(seconds, soonest, latest, limit, tr.level, tr.slope, tr)
