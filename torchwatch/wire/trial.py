"""The live trial's contract: its request (``request.json`` with ``"kind": "trial"``), its
published state (``hook.json``'s ``"trial"``) and the statistics that decide it. The settings a
trial may change are :mod:`~torchwatch.wire.settings`; the trial itself runs in the hook
(:mod:`torchwatch.hook.trial`).

A trial switches one setting of a running training on for a block of steps, off for the next,
in the order on, off, off, on, on, off, off, on ... (ABBA: a linear drift of the step time, a
warming cache or a slowly filling disk, cancels within each group of four), drops the first
steps after each switch, and compares the blocks pairwise (:func:`estimate`). Settings that only
take effect when a DataLoader iterator is made alternate whole epochs instead
(:data:`~torchwatch.wire.settings.ITERATOR`), with no step dropped: an iterator's start (its
workers) is part of what the setting costs, as it is in two separate runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import TEXT, WireError, _Obj
from .settings import ITERATOR, NUMERICS, STEPS, VALUE_TEXT

__all__ = [
    "MAX_BLOCKS",
    "RATIO_LIMIT",
    "TRIAL_KIND",
    "TRIAL_STATES",
    "TRIAL_STOP_KIND",
    "TRIM",
    "TRIM_FROM",
    "Estimate",
    "TrialBlock",
    "TrialRequest",
    "TrialState",
    "estimate",
    "is_on",
    "t975",
    "trimmed_interval",
]


TRIAL_KIND = "trial"  # request.json's "kind" for a trial (a request without "kind" is a burst's)
TRIAL_STOP_KIND = "trial-stop"  # ... to end the running trial now (torchwatch was stopped)
TRIAL_STATES = ("waiting", "running", "done", "refused", "stopped", "failed")
MAX_BLOCKS = 64


def is_on(block: int) -> bool:
    """Whether block ``block`` (0-based) runs with the setting: on, off, off, on, on, off, ..."""
    return block % 4 in (0, 3)


@dataclass(frozen=True)
class TrialRequest:
    """A trial asked of the hook (``request.json`` with ``"kind": "trial"``).

    Attributes:
        id: chosen by torchwatch (1 to 2**31), the same for every rank of a job.
        setting / value: the setting's name (:data:`SETTINGS`) and its value as text.
        block_steps: steps per block (steps mode), dropped ones included (2 to 1000).
        warmup: steps dropped after each switch (0 to ``block_steps - 1``).
        max_s: the trial ends after this long in any case, s (5 to 600); the hook then puts the
            old value back by itself, whether torchwatch is still there or not.
        target: the trial ends once the speed-up's 95 % interval is within ±``target`` (0.01 to
            0.5, relative), after at least ``min_pairs`` pairs of blocks.
        min_pairs: pairs of blocks (one on, one off) before the trial may end (2 to 16).
        max_blocks: blocks at most (4 to :data:`MAX_BLOCKS`).
        keep: keep the new value at the end when the trial found it faster.
        allow_numerics: allow a ``precision`` setting.
        start_step: the step (as the hook counts them) at which the first block starts, the same
            on every rank; ``None``: the next step.
    """

    id: int
    setting: str
    value: str
    block_steps: int = 10
    warmup: int = 2
    max_s: float = 60.0
    target: float = 0.05
    min_pairs: int = 3
    max_blocks: int = MAX_BLOCKS
    keep: bool = False
    allow_numerics: bool = False
    start_step: int | None = None

    @classmethod
    def decode(cls, value: object, where: str = "request.json") -> TrialRequest:
        """Raises: WireError (a missing field, a wrong type, a value out of range)."""
        o = _Obj(value, where)
        block = o.integer("block_steps", 2, 1000)
        warmup = o.integer("warmup", 0, 999)
        if warmup >= block:
            raise WireError(f"{where}.warmup: {warmup} leaves no step of a {block}-step block")
        return cls(
            id=o.integer("id", 1, 1 << 31),
            setting=o.text("setting", 40),
            value=o.text("value", VALUE_TEXT),
            block_steps=block,
            warmup=warmup,
            max_s=o.number("max_s", 5.0, 600.0),
            target=o.number("target", 0.01, 0.5),
            min_pairs=o.integer("min_pairs", 2, 16),
            max_blocks=o.integer("max_blocks", 4, MAX_BLOCKS),
            keep=o.flag("keep"),
            allow_numerics=o.flag("allow_numerics"),
            start_step=o.integer("start_step", 0, 1 << 62, optional=True),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object, with ``"kind": "trial"``."""
        return {"kind": TRIAL_KIND, **self.__dict__}


@dataclass(frozen=True)
class TrialBlock:
    """One block of a trial.

    Attributes:
        on: run with the trial's value (``False``: the training's own).
        first_step: the step (as the hook counts them) the block started at.
        steps: steps measured; dropped: steps run but not measured (after the switch).
        mean_s / median_s: of the measured steps' durations, s.
    """

    on: bool
    first_step: int
    steps: int
    dropped: int
    mean_s: float
    median_s: float

    @classmethod
    def decode(cls, value: object, where: str) -> TrialBlock:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            o.flag("on"),
            o.integer("first_step", 0, 1 << 62),
            o.integer("steps", 0, 1 << 30),
            o.integer("dropped", 0, 1 << 30),
            o.number("mean_s", 0.0, 1e6),
            o.number("median_s", 0.0, 1e6),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class Estimate:
    """The trial's result so far.

    Attributes:
        speedup: the training's step time without the setting over the step time with it
            (1.25: steps are 25 % faster with it; 0.8: slower), the geometric mean over pairs.
        lo / hi: its 95 % interval (Student's t over the pairs' log ratios); equal to
            ``speedup`` with a single pair.
        pairs: pairs of blocks compared.
    """

    speedup: float
    lo: float
    hi: float
    pairs: int

    @property
    def half_width(self) -> float:
        """Half the interval's width, relative (0.05: ±5 %)."""
        return (self.hi - self.lo) / 2 / self.speedup

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return dict(self.__dict__)


# Student's t, two-sided 95 % (0.975 quantile), by degrees of freedom (any statistics table).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042}  # fmt: skip


def t975(df: int) -> float:
    """Student's t 0.975 quantile for ``df`` degrees of freedom (the next tabled df below; 1.96
    past 30)."""
    if df > 30:
        return 1.96
    return _T975[max(d for d in _T975 if d <= max(1, df))]


def estimate(blocks: Sequence[TrialBlock]) -> Estimate | None:
    """The speed-up and its 95 % interval from blocks paired in order ((0, 1), (2, 3), ...: each
    pair has one block on and one off, :func:`is_on`); ``None`` before a complete pair, or when a
    block of a pair measured no step.

    Each pair gives ``log(mean off / mean on)``; their mean and Student's t interval (from
    :data:`TRIM_FROM` pairs on, the 20 % trimmed mean and Yuen's interval: :func:`trimmed_interval`),
    taken back with ``exp``. Pairs of neighbouring blocks see the same state of the machine, so a load that
    comes and goes widens the interval instead of biasing the mean.
    """
    logs: list[float] = []
    for i in range(0, len(blocks) - 1, 2):
        a, b = blocks[i], blocks[i + 1]
        if a.on == b.on or a.steps == 0 or b.steps == 0 or a.mean_s <= 0 or b.mean_s <= 0:
            return None
        on, off = (a, b) if a.on else (b, a)
        logs.append(math.log(off.mean_s / on.mean_s))
    if not logs:
        return None
    n = len(logs)
    if n == 1:
        one = _bounded(logs[0])
        return Estimate(one, one, one, 1)
    center, half = trimmed_interval(logs, TRIM if n >= TRIM_FROM else 0.0)
    return Estimate(_bounded(center), _bounded(center - half), _bounded(center + half), n)


RATIO_LIMIT = 1000.0  # a step-time ratio (or an interval's end) is shown within 1/1000..1000: beyond is noise


def _bounded(log_ratio: float) -> float:
    """``exp(log_ratio)`` within ``1/RATIO_LIMIT .. RATIO_LIMIT`` (two pairs on a busy machine can
    give an interval end of 10**7: it says "undecided" as well at 1000)."""
    if not math.isfinite(log_ratio):
        return RATIO_LIMIT if log_ratio > 0 else 1 / RATIO_LIMIT
    return min(RATIO_LIMIT, max(1 / RATIO_LIMIT, math.exp(max(-50.0, min(50.0, log_ratio)))))


TRIM = 0.2  # Yuen's 20 % trimmed mean: a pair or two hit by another process's burst do not decide
TRIM_FROM = 5  # pairs; below this nothing is trimmed (the plain mean and Student's t)


def trimmed_interval(values: Sequence[float], trim: float) -> tuple[float, float]:
    """The ``trim``-trimmed mean of ``values`` and the half-width of its 95 % interval (Yuen 1974,
    Tukey-McLaughlin: the winsorized standard deviation over ``(1 - 2 trim) sqrt(n)``, Student's
    t with ``n - 2g - 1`` degrees of freedom, ``g = floor(trim n)``). ``trim = 0``: the mean and
    Student's t interval. Needs at least 2 values."""
    xs = sorted(values)
    n = len(xs)
    g = math.floor(trim * n)
    kept = xs[g : n - g]
    center = sum(kept) / len(kept)
    wins = [xs[g]] * g + kept + [xs[n - g - 1]] * g
    wmean = sum(wins) / n
    sw = math.sqrt(sum((x - wmean) ** 2 for x in wins) / (n - 1))
    half = t975(max(1, n - 2 * g - 1)) * sw / ((1 - 2 * g / n) * math.sqrt(n))
    return center, half


@dataclass(frozen=True)
class TrialState:
    """The hook's last trial, as published in ``hook.json`` (``"trial"``).

    Attributes:
        id / setting / value: the request's.
        old: the training's value before the trial (``show_value`` text), ``""`` when not read.
        mode / numerics: the setting's (:class:`Setting`).
        state: one of :data:`TRIAL_STATES`: ``waiting`` (for its start step or a new iterator),
            ``running``, ``done`` (ended by its own rule: decided, ``max_s`` or ``max_blocks``),
            ``refused`` (never applied), ``stopped`` (torchwatch asked), ``failed`` (applying or
            putting back raised).
        reason: why it ended or was refused, one line.
        blocks: the blocks measured, in order.
        estimate: the result over the complete pairs (``None``: fewer than one).
        restored: the old value was put back and read back equal (``None``: not yet / never
            changed); kept: the new value was kept (``keep``).
        now_value: the setting's value read back after the trial ended.
        started / ended: monotonic s (0: not yet).
    """

    id: int
    setting: str
    value: str
    state: str
    old: str = ""
    mode: str = STEPS
    numerics: str = "exact"
    reason: str = ""
    blocks: tuple[TrialBlock, ...] = ()
    estimate: Estimate | None = None
    restored: bool | None = None
    kept: bool = False
    now_value: str = ""
    started: float = 0.0
    ended: float = 0.0

    @classmethod
    def decode(cls, value: object, where: str) -> TrialState:
        """Raises: WireError."""
        o = _Obj(value, where)
        est = o.d.get("estimate")
        estimate_ = None
        if est is not None:
            e = _Obj(est, f"{where}.estimate")
            lim = RATIO_LIMIT
            estimate_ = Estimate(
                e.number("speedup", 1 / lim, lim), e.number("lo", 1 / lim, lim), e.number("hi", 1 / lim, lim),
                e.integer("pairs", 1, MAX_BLOCKS),
            )  # fmt: skip
        return cls(
            id=o.integer("id", 1, 1 << 31),
            setting=o.text("setting", 40),
            value=o.text("value", VALUE_TEXT),
            state=o.text("state", 16, choices=TRIAL_STATES),
            old=o.text("old", VALUE_TEXT, optional=True) or "",
            mode=o.text("mode", 16, choices=(STEPS, ITERATOR)),
            numerics=o.text("numerics", 16, choices=NUMERICS),
            reason=o.text("reason", TEXT, optional=True) or "",
            blocks=tuple(TrialBlock.decode(v, w) for v, w in o.items("blocks", MAX_BLOCKS)),
            estimate=estimate_,
            restored=o.flag("restored", optional=True),
            kept=o.flag("kept", optional=True) or False,
            now_value=o.text("now_value", VALUE_TEXT, optional=True) or "",
            started=o.number("started", 0.0, 1e10),
            ended=o.number("ended", 0.0, 1e10),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        d = dict(self.__dict__)
        d["blocks"] = [b.to_json() for b in self.blocks]
        d["estimate"] = None if self.estimate is None else self.estimate.to_json()
        return d

    @property
    def finished(self) -> bool:
        """Whether the trial is over (done, refused, stopped or failed)."""
        return self.state not in ("waiting", "running")
