"""The training's progress and loss as the faces show them (:class:`ProgressView`), made by
:mod:`torchwatch.analysis.progress` from the hook's readings."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torchwatch.model.units import human_duration

__all__ = ["ProgressView", "fmt_loss"]


def fmt_loss(value: float | None) -> str:
    """A loss in 4 significant digits (``nan``, ``inf``; ``-`` when ``None``)."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def _count(value: float) -> str:
    """A bar's count: ``37`` (``37.5`` where the bar counts fractions)."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.4g}"


@dataclass(frozen=True)
class ProgressView:
    """Where the focus rank's training is and how its loss goes.

    Attributes:
        epoch: the epoch of its busiest DataLoader, from 1 (``None``: no DataLoader iterated).
        batch: batches taken in that epoch. epoch_len: its length in batches (``None``: unknown).
        batches_per_s: batches taken per second over the last 30 s of the epoch (``None``: not
            measured yet).
        eta_s: seconds left in the epoch at that rate, s (``None``: see ``unknown``).
        unknown: why the epoch's time left (or the epoch) is not known, one line; ``""`` when it is.
            The run's total (epochs to come) is known only from a ``tqdm`` bar (``bar_*``).
        loss: the last loss read (may be NaN or ±inf). loss_step: its step, from 1.
        loss_series: the loss smoothed (medians of 5 s), oldest first, the last 5 minutes.
        loss_trend_per_min: Theil-Sen slope of the smoothed loss over the last 2 minutes (or
            what there is of it, from 20 s), loss units per minute.
        loss_note: why there is no loss (a ``backward()`` of a non-scalar, with ``gradient=``).
        nonfinite_step: the step of the first NaN/inf reading; last_finite_step: the reading
            before it (the loss turned in between: the hook reads a few times a second).
        bar_desc, bar_n, bar_total: the training's outermost ``tqdm`` bar with a total (its
            description, iterations done and expected; ``None``: no such bar). Where the bar
            counts epochs or the run's steps (``tqdm(range(epochs))``, the HF ``Trainer``), this
            is the run's total, which the hook cannot see otherwise.
        bar_share: the share of that bar done, 0-1 (with the share of the bar nested in it).
        bar_eta_s: the time left on it at its pace of the last 30 s (else its average pace
            since it started), s (``None``: nothing done yet).
    """

    epoch: int | None = None
    batch: int = 0
    epoch_len: int | None = None
    batches_per_s: float | None = None
    eta_s: float | None = None
    unknown: str = ""
    loss: float | None = None
    loss_step: int | None = None
    loss_series: tuple[float, ...] = ()
    loss_trend_per_min: float | None = None
    loss_note: str = ""
    nonfinite_step: int | None = None
    last_finite_step: int | None = None
    bar_desc: str = ""
    bar_n: float | None = None
    bar_total: float | None = None
    bar_share: float | None = None
    bar_eta_s: float | None = None

    def bar_words(self) -> str:
        """``tqdm "Epochs" 3/10 · 12 min left`` (``""`` without a bar with a total)."""
        if self.bar_total is None or self.bar_n is None:
            return ""
        name = f'tqdm "{self.bar_desc}"' if self.bar_desc else "tqdm bar"
        left = f"{human_duration(self.bar_eta_s)} left" if self.bar_eta_s is not None else "time left unknown"
        return f"{name} {_count(self.bar_n)}/{_count(self.bar_total)} · {left}"

    def epoch_words(self) -> str:
        """``epoch 3 · 27/100 · 1 min 5 s left`` (or what of it is known)."""
        if self.epoch is None:
            return f"epoch unknown ({self.unknown})" if self.unknown else "epoch unknown"
        where = f"{self.batch}/{self.epoch_len}" if self.epoch_len is not None else f"batch {self.batch}"
        left = f"{human_duration(self.eta_s)} left" if self.eta_s is not None else f"time left unknown: {self.unknown}"
        return f"epoch {self.epoch} · {where} · {left}"

    def loss_words(self) -> str:
        """``loss 0.412 at step 812, -0.031/min`` (or why there is none)."""
        if self.loss is None and self.nonfinite_step is not None:  # a report: NaN is written as null
            return f"loss not finite since step {self.nonfinite_step} (last finite at step {self.last_finite_step})"
        if self.loss is None:
            return f"no loss: {self.loss_note}" if self.loss_note else "no loss read yet"
        text = f"loss {fmt_loss(self.loss)} at step {self.loss_step}"
        if self.loss_trend_per_min is not None:
            text += f", {self.loss_trend_per_min:+.3g}/min"
        if self.nonfinite_step is not None:
            text += f" (not finite since step {self.nonfinite_step})"
        return text

    def line(self) -> str:
        """One line for the status line and the report: the epoch, the outermost tqdm bar
        (where there is one), then the loss."""
        bar = self.bar_words()
        return f"{self.epoch_words()} | {bar + ' | ' if bar else ''}{self.loss_words()}"
