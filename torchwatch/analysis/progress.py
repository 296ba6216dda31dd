"""Progress and loss health from the hook's readings: the epoch and its time left, the loss's
trend, and the features the health rules read (``rules/loss-*.toml``).

Pure functions of the hook readings of the last minutes (the store keeps 5): every reading of
``hook.json`` carries the hook's last :data:`~torchwatch.wire.LOSS_HISTORY` loss readings, and
merging them by step gives the loss series. Where each number comes from:

- time left in the epoch: the batches still to come (``len(loader)`` minus the batches taken)
  over the batches taken per second in the last :data:`RATE_S` of the same epoch;
- time left on the training's outermost ``tqdm`` bar (:func:`bar_progress`): the share still
  to do (its ``n`` over its ``total``, plus the share of the bar nested in it, where one is) over
  the share done per second in the last :data:`RATE_S` (as the epoch's); where the share did
  not move in that window (a bar of long epochs with no bar inside it), at the average pace
  since the bar started, tqdm's "average" estimate;
- the loss smoothed: medians of :data:`BUCKET_S` buckets (a minibatch loss is noisy; a median
  ignores the odd hard batch);
- the trend: the Theil-Sen slope of those medians over the last :data:`STALL_WINDOW_S`, with
  its 95 % interval (Sen 1968, as the memory forecast's);
- a spike: the largest reading of the last :data:`SPIKE_RECENT_S` against the median and the
  robust spread (1.4826 x the median absolute deviation, Iglewicz and Hoaglin 1993) of the
  readings of the :data:`SPIKE_BASELINE_S` before.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from torchwatch.model.forecast import theil_sen
from torchwatch.model.progress import ProgressView, fmt_loss
from torchwatch.model.readings import HookState
from torchwatch.wire import STILL_WHY, BarInfo, LossSample, ProgressInfo

__all__ = [
    "BUCKET_S",
    "CATALOGUE",
    "KEEP_S",
    "RATE_S",
    "SPIKE_BASELINE_S",
    "SPIKE_MIN_BASELINE",
    "SPIKE_RECENT_S",
    "STALL_MIN_BUCKETS",
    "STALL_WINDOW_S",
    "bar_progress",
    "features",
    "progress",
    "progress_words",
]

KEEP_S = 300.0  # minutes of readings read (the store keeps 300 s)
RATE_S = 30.0  # the batch rate over the last 30 s of the epoch
BUCKET_S = 5.0  # the smoothed loss: medians of 5 s
TREND_MIN_BUCKETS = 4  # a trend needs 20 s of smoothed loss
STALL_WINDOW_S = 120.0  # loss-stalled: no trend over the last 2 minutes
STALL_MIN_BUCKETS = 20  # of the 24 buckets of 5 s in it (a pause of up to 20 s is allowed)
SPIKE_RECENT_S = 5.0  # a spike: a reading of the last 5 s ...
SPIKE_BASELINE_S = 60.0  # ... against the minute before it
SPIKE_MIN_BASELINE = 20  # readings the baseline needs (5 s of them at the hook's 4 Hz)
SPIKE_Z = 8.0  # rules/loss-spike.toml's z and ratio: where the jump a spike names began
SPIKE_RATIO = 1.5

CATALOGUE: tuple[tuple[str, str, str, str], ...] = (
    ("epoch", "count", "hook", "the epoch of the busiest DataLoader (iterators made over it), from 1"),
    ("epoch_batch", "count", "hook", "batches taken in that epoch"),
    ("epoch_len", "count", "hook", "len(loader): batches in an epoch (none for an IterableDataset without __len__)"),
    ("epoch_batches_per_s", "number", "hook", f"batches taken per second over the last {RATE_S:g} s of the epoch"),
    ("epoch_eta_s", "s", "hook", "time left in the epoch: batches to come over batches per second"),
    (
        "bar_share",
        "share",
        "hook",
        "the share done of the training's outermost tqdm bar with a total (n/total, with the bar nested in it)",
    ),
    (
        "bar_eta_s",
        "s",
        "hook",
        f"time left on that bar: the share to do over the share done per second in the last {RATE_S:g} s "
        "(else its average pace since it started)",
    ),
    ("loss", "number", "hook", "the last loss read (the scalar backward() was called on), NaN/inf as read"),
    ("loss_step", "count", "hook", "the step of that reading, from 1"),
    (
        "loss_trend_per_min",
        "value",
        "hook",
        f"Theil-Sen slope of the loss's {BUCKET_S:g} s medians over the last {STALL_WINDOW_S:g} s (from 20 s), per min",
    ),
    (
        "loss_change_share",
        "share",
        "hook",
        f"the loss's change over the last {STALL_WINDOW_S:g} s (slope x window) over its median, absolute; "
        f"only with {STALL_MIN_BUCKETS} of the window's {BUCKET_S:g} s buckets",
    ),
    ("loss_trend_significant", "flag", "hook", "1 when the slope's 95 % interval excludes zero"),
    ("loss_nonfinite", "flag", "hook", "1 once a loss reading was NaN or inf (0: all finite; none: no loss read)"),
    ("loss_nonfinite_step", "count", "hook", "the step of the first NaN/inf reading"),
    ("loss_last_finite_step", "count", "hook", "the step of the last finite reading before it (0: none)"),
    (
        "loss_spike_z",
        "value",
        "hook",
        f"the largest reading of the last {SPIKE_RECENT_S:g} s minus the median of the {SPIKE_BASELINE_S:g} s "
        "before, over their robust spread (1.4826 x MAD)",
    ),
    ("loss_spike_ratio", "number", "hook", "that largest reading over the baseline's median"),
    (
        "params_still_s",
        "s",
        "hook",
        "s for which the optimizer's steps have changed no parameter (no gradient, every learning rate 0, "
        "or none written by a torch.optim optimizer), as of the hook's last record; 0 while they change one",
    ),
    ("params_still_steps", "count", "hook", "optimizer steps in that time"),
    (
        "params_still_why",
        "code",
        "hook",
        "why: 1 no parameter has a gradient, 2 every learning rate is 0, 3 none written",
    ),
    ("params_with_grad", "count", "hook", "parameter tensors of the optimizer with a gradient at the last record"),
    ("params_count", "count", "hook", "parameter tensors of the optimizer looked at"),
    (
        "loss_spike_step",
        "count",
        "hook",
        "the step the jump began: the first reading of the last minute beyond the rule's line (z 8, 1.5x); "
        "else the largest reading's",
    ),
)
"""The features of this module (name, unit, source, meaning), added to the analysis's catalogue."""


def _series(readings: Sequence[HookState]) -> tuple[list[LossSample], ProgressInfo | None]:
    """The loss readings of every ``hook.json`` read, merged by step (oldest first), and the
    last progress record."""
    by_step: dict[int, LossSample] = {}
    last: ProgressInfo | None = None
    for h in readings:
        p = h.record.progress if h.record is not None else None
        if p is None:
            continue
        last = p
        for s in p.loss:
            by_step[s.step] = s
    return [by_step[k] for k in sorted(by_step)], last


def _buckets(samples: Sequence[LossSample], start: float) -> list[tuple[float, float]]:
    """``(bucket middle, median)`` of the finite readings from ``start`` on, in :data:`BUCKET_S` buckets."""
    groups: dict[int, list[float]] = {}
    for s in samples:
        if s.t >= start and math.isfinite(s.value):
            groups.setdefault(int((s.t - start) // BUCKET_S), []).append(s.value)
    return [(start + (k + 0.5) * BUCKET_S, statistics.median(v)) for k, v in sorted(groups.items())]


def _rate(readings: Sequence[HookState], epoch: int | None, now: float) -> float | None:
    """Batches per second over the last :data:`RATE_S` of ``epoch`` (``None``: under 2 s of it,
    or no batch taken)."""
    points = [
        (_made(h), h.record.progress.batch)
        for h in readings
        if h.t >= now - RATE_S
        and h.record is not None
        and h.record.progress is not None
        and h.record.progress.epoch == epoch
    ]
    return _pace(points)


def _pace(points: Sequence[tuple[float, float]]) -> float | None:
    """How fast ``(t, amount)`` points (oldest first) moved: the amount's rise from the first to
    the last over their times, per s; ``None`` under 2 points or 2 s, or when it did not rise."""
    if len(points) < 2:
        return None
    (t0, a0), (t1, a1) = points[0], points[-1]
    if t1 - t0 < 2.0 or a1 <= a0:
        return None
    return (a1 - a0) / (t1 - t0)


def _made(h: HookState) -> float:
    """When the hook made the progress record ``h`` carries (monotonic s; the time torchwatch read
    it for a record of an older hook, or one whose time is not on torchwatch's clock: after the
    read, or more than :data:`KEEP_S` before it, as from another time namespace)."""
    p = h.record.progress if h.record is not None else None
    return p.at if p is not None and p.at is not None and h.t - KEEP_S <= p.at <= h.t else h.t


def _last_bars(readings: Sequence[HookState]) -> tuple[float, tuple[BarInfo, ...]]:
    """The bars of the last reading that had any, and when the hook made that record (monotonic
    s): a bar closed at the end of its loop (its script then saves and exits) stays shown at its
    last reading, as tqdm leaves it on the screen. ``(0.0, ())`` when none had a bar."""
    for h in reversed(readings):
        p = h.record.progress if h.record is not None else None
        if p is not None and p.bars:
            return _made(h), p.bars
    return 0.0, ()


def _bar_rate(readings: Sequence[HookState], outer: BarInfo, start: float, now: float) -> float | None:
    """The share of ``outer`` done per second over the last :data:`RATE_S` of readings of the
    same bar (its description and total, and its ``start``, monotonic s: a reading's time minus
    the bar's elapsed, within 1 s); ``None``: under 2 s of them, or the share did not move."""
    points: list[tuple[float, float]] = []
    for h in readings:
        p = h.record.progress if h.record is not None else None
        if h.t < now - RATE_S or p is None or not p.bars:
            continue
        got = bar_progress(p.bars)
        if got is None:
            continue
        bar, share, _eta = got
        same = (bar.desc, bar.total) == (outer.desc, outer.total)
        if same and abs((_made(h) - bar.elapsed_s) - start) < 1.0:
            points.append((_made(h), share))
    return _pace(points)


def bar_progress(bars: Sequence[BarInfo]) -> tuple[BarInfo, float, float | None] | None:
    """The outermost ``tqdm`` bar with a total, the share of it done (0-1) and the time left
    on it in s; ``None`` when no bar has a total.

    The share: ``n / total``, plus ``n / total`` of the next bar in (a bar of batches inside a
    bar of epochs) over the outer ``total``, where that bar has a total and the outer bar has
    not ended. The time left: ``elapsed x (1 - share) / share`` (``None`` before any share is
    done: no pace yet).
    """
    with_total = [b for b in bars if b.total]
    if not with_total:
        return None
    outer = with_total[0]
    total = outer.total or 1.0
    share = min(1.0, outer.n / total)
    inner = next((b for b in with_total[1:] if b.pos > outer.pos), None)
    if inner is not None and inner.total and outer.n < total:
        share = min(1.0, (outer.n + min(1.0, inner.n / inner.total)) / total)
    if share <= 0.0:
        return outer, share, None
    return outer, share, outer.elapsed_s * (1.0 - share) / share


def progress(readings: Sequence[HookState], pid: int | None, now: float) -> ProgressView | None:
    """The progress of ``pid`` (``None``: of any process) from its hook readings up to ``now``
    (monotonic s), oldest first; ``None`` when none of them carries progress."""
    mine = [h for h in readings if (pid is None or h.pid == pid) and h.t >= now - KEEP_S]
    samples, last = _series(mine)
    if last is None:
        return None
    rate = _rate(mine, last.epoch, now)
    eta = None
    unknown = ""
    if last.epoch is None:
        unknown = "no DataLoader iterated"
    elif last.epoch_len is None:
        unknown = "the DataLoader has no length (an IterableDataset without __len__)"
    elif rate is None:
        unknown = "the batch rate is not measured yet"
    else:
        made = next(_made(h) for h in reversed(mine) if h.record is not None and h.record.progress is last)
        eta = max(0.0, max(0.0, last.epoch_len - last.batch) / rate - (now - made))  # as of now
    first_bad = last.first_nonfinite
    last_finite = None
    if first_bad is not None:
        before = [s.step for s in samples if s.step < first_bad.step and math.isfinite(s.value)]
        last_finite = before[-1] if before else 0
    smoothed = _buckets(samples, now - KEEP_S)
    recent = [b for b in smoothed if b[0] >= now - STALL_WINDOW_S]
    trend = None
    if len(recent) >= TREND_MIN_BUCKETS:
        trend = theil_sen(recent)[0] * 60.0
    latest = samples[-1] if samples else None
    seen, bars = _last_bars(mine)
    bar = bar_progress(bars)
    if bar is not None:
        pace = _bar_rate(mine, bar[0], seen - bar[0].elapsed_s, now)
        if pace is not None:
            bar = (bar[0], bar[1], max(0.0, 1.0 - bar[1]) / pace)
        if bar[2] is not None:  # as of now, not of the record
            bar = (bar[0], bar[1], max(0.0, bar[2] - (now - seen)))
    return ProgressView(
        epoch=last.epoch,
        batch=last.batch,
        epoch_len=last.epoch_len,
        batches_per_s=rate,
        eta_s=eta,
        unknown=unknown,
        loss=latest.value if latest is not None else None,
        loss_step=latest.step if latest is not None else None,
        loss_series=tuple(v for _t, v in smoothed),
        loss_trend_per_min=trend,
        loss_note=last.loss_note,
        nonfinite_step=first_bad.step if first_bad is not None else None,
        last_finite_step=last_finite,
        bar_desc=bar[0].desc if bar is not None else "",
        bar_n=bar[0].n if bar is not None else None,
        bar_total=bar[0].total if bar is not None else None,
        bar_share=bar[1] if bar is not None else None,
        bar_eta_s=bar[2] if bar is not None else None,
    )


def features(readings: Sequence[HookState], pid: int | None, now: float) -> dict[str, float | None]:
    """Every feature of :data:`CATALOGUE` (``None`` where not known: no loss read, too few readings)."""
    out: dict[str, float | None] = dict.fromkeys(name for name, *_ in CATALOGUE)
    view = progress(readings, pid, now)
    if view is None:
        return out
    mine = [h for h in readings if (pid is None or h.pid == pid) and h.t >= now - KEEP_S]
    samples, last = _series(mine)
    out.update(_still(last))
    out.update(
        epoch=view.epoch,
        epoch_batch=float(view.batch) if view.epoch is not None else None,
        epoch_len=view.epoch_len,
        epoch_batches_per_s=view.batches_per_s,
        epoch_eta_s=view.eta_s,
        bar_share=view.bar_share,
        bar_eta_s=view.bar_eta_s,
        loss=view.loss,
        loss_step=view.loss_step,
        loss_trend_per_min=view.loss_trend_per_min,
    )
    if not samples:
        return out
    out["loss_nonfinite"] = 0.0 if view.nonfinite_step is None else 1.0
    if view.nonfinite_step is not None:
        out["loss_nonfinite_step"] = view.nonfinite_step
        out["loss_last_finite_step"] = view.last_finite_step
    out.update(_stall(samples, now))
    out.update(_spike(samples, now))
    return out


def _still(last: ProgressInfo | None) -> dict[str, float | None]:
    """``params_still_*`` from the last record's :class:`UpdateInfo` (none: no optimizer step read)."""
    u = last.updates if last is not None else None
    if u is None:
        return {}
    return {
        "params_still_s": u.still_s,
        "params_still_steps": float(u.still_steps),
        "params_still_why": float(STILL_WHY.index(u.why)),
        "params_with_grad": float(u.with_grad),
        "params_count": float(u.params),
    }


def _stall(samples: Sequence[LossSample], now: float) -> Mapping[str, float | None]:
    """``loss_change_share`` and ``loss_trend_significant`` over the last :data:`STALL_WINDOW_S`."""
    window = _buckets(samples, now - STALL_WINDOW_S)
    if len(window) < STALL_MIN_BUCKETS:
        return {}
    slope, lo, hi = theil_sen(window)
    level = abs(statistics.median(v for _t, v in window))
    significant = 1.0 if lo > 0 or hi < 0 else 0.0
    if level <= 0:
        return {"loss_trend_significant": significant}
    return {"loss_change_share": abs(slope) * STALL_WINDOW_S / level, "loss_trend_significant": significant}


def _spike(samples: Sequence[LossSample], now: float) -> Mapping[str, float | None]:
    """``loss_spike_z``, ``loss_spike_ratio`` and ``loss_spike_step``: the last
    :data:`SPIKE_RECENT_S` against the :data:`SPIKE_BASELINE_S` before."""
    cut = now - SPIKE_RECENT_S
    recent = [s for s in samples if s.t >= cut and math.isfinite(s.value)]
    base = [s.value for s in samples if cut - SPIKE_BASELINE_S <= s.t < cut and math.isfinite(s.value)]
    if not recent or len(base) < SPIKE_MIN_BASELINE:
        return {}
    peak = max(recent, key=lambda s: s.value)
    median = statistics.median(base)
    spread = 1.4826 * statistics.median(abs(v - median) for v in base)
    floor = max(1e-3 * abs(median), 1e-12)  # a constant loss: a jump of 0.1 % of it is one spread
    scale = max(spread, floor)
    # the step the jump began: the first reading of the last minute as far out as the rule's line
    # (a loss that stays up after a jump keeps the rule on for a while: its peak moves on, its start does not)
    line = median + SPIKE_Z * scale
    lookback = [s for s in samples if s.t >= cut - SPIKE_BASELINE_S and math.isfinite(s.value)]
    start = next((s for s in lookback if s.value >= line and s.value >= SPIKE_RATIO * median), peak)
    out: dict[str, float | None] = {
        "loss_spike_z": (peak.value - median) / scale,
        "loss_spike_step": float(min(start.step, peak.step)),
    }
    if median > 0:
        out["loss_spike_ratio"] = peak.value / median
    return out


def progress_words(info: ProgressInfo) -> str:
    """One hook record's progress in words, for the hang record: ``epoch 3, batch 27/100, loss
    0.412 at step 227`` (what of it is known; ``""`` when nothing is)."""
    parts = []
    if info.epoch is not None:
        parts.append(f"epoch {info.epoch}, batch {info.batch}" + (f"/{info.epoch_len}" if info.epoch_len else ""))
    if info.loss:
        last = info.loss[-1]
        parts.append(f"loss {fmt_loss(last.value)} at step {last.step}")
    return ", ".join(parts)
