"""The training's progress and loss as ``hook.json`` carries them (:class:`ProgressInfo`): the
epoch of the busiest DataLoader, the batch within it and its length, and the loss that
``backward()`` was called on, sampled a few times a second (:data:`LOSS_EVERY_S`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .base import _U63, TEXT, WireError, _number, _Obj, _type

__all__ = [
    "BARS_MAX",
    "BAR_DESC",
    "BAR_MAX_COUNT",
    "LOSS_EVERY_S",
    "LOSS_HISTORY",
    "LOSS_MAX",
    "PARAMS_SCANNED",
    "STILL_WHY",
    "BarInfo",
    "LossSample",
    "ProgressInfo",
    "UpdateInfo",
]

LOSS_EVERY_S = 0.25  # the hook reads the loss at most 4 times a second
LOSS_HISTORY = 32  # samples the hook publishes (8 s at 4 Hz; torchwatch keeps minutes of them)
LOSS_MAX = 1e300  # a finite loss beyond this is refused as not a number the hook read
BARS_MAX = 4  # tqdm bars published (outermost first): an epoch bar, a batch bar, an eval bar, one more
BAR_DESC = 80  # characters of a bar's description kept
BAR_MAX_COUNT = 1e15  # a bar's n or total beyond this is refused
PARAMS_SCANNED = 20_000  # parameter tensors the hook looks at per record (an LLM has ~300-3,000)
STILL_WHY = ("", "no-grad", "lr-zero", "unchanged")
"""Why the optimizer's steps change no parameter (:attr:`UpdateInfo.why`): ``no-grad`` (none of its
parameters has a ``.grad``), ``lr-zero`` (every group's learning rate is 0), ``unchanged`` (no
parameter was written: a step that skips them)."""
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@dataclass(frozen=True)
class LossSample:
    """One reading of the loss.

    Attributes:
        step: the step the loss belongs to, counted from 1 (the hook's step count + 1 at the
            ``backward()`` call: the same numbering as the trace's ``ProfilerStep#N``).
        t: when ``backward()`` was called, monotonic s.
        value: the loss as a Python float; NaN and ±inf as they were read (JSON carries them as
            the strings ``"nan"``, ``"inf"``, ``"-inf"``).
    """

    step: int
    t: float
    value: float

    @classmethod
    def decode(cls, value: object, where: str) -> LossSample:
        """``[step, t, value]``. Raises: WireError."""
        if not isinstance(value, list) or len(value) != 3:
            raise WireError(f"{where}: expected [step, t, value], got {_type(value)}")
        step, t, v = value
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= _U63:
            raise WireError(f"{where}[0]: expected a step count")
        if isinstance(v, str):
            if v not in _NONFINITE:
                raise WireError(f"{where}[2]: {v[:8]!r} is not nan, inf or -inf")
            loss = _NONFINITE[v]
        else:
            loss = _number(v, -LOSS_MAX, LOSS_MAX, f"{where}[2]")
        return cls(step, _number(t, 0.0, 1e10, f"{where}[1]"), loss)

    def to_json(self) -> list[Any]:
        """``[step, t, value]``, the value a number or ``"nan"``/``"inf"``/``"-inf"``."""
        v = self.value
        if math.isnan(v):
            shown: float | str = "nan"
        elif math.isinf(v):
            shown = "inf" if v > 0 else "-inf"
        else:
            shown = v
        return [self.step, self.t, shown]


@dataclass(frozen=True)
class BarInfo:
    """One live ``tqdm`` progress bar of the training, as the hook read it (its own attributes,
    nothing computed).

    Attributes:
        n: iterations done (``bar.n``; a float where the bar counts bytes or scaled units).
        total: iterations the bar expects (``bar.total``); ``None``: the bar has no total.
        desc: the bar's description (``bar.desc``, at most :data:`BAR_DESC` characters).
        elapsed_s: s since the bar started (``time.time() - bar.start_t``).
        pos: the bar's position (0: the outermost; nested bars count up).
    """

    n: float
    total: float | None
    desc: str
    elapsed_s: float
    pos: int = 0

    @classmethod
    def decode(cls, value: object, where: str) -> BarInfo:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            o.number("n", 0.0, BAR_MAX_COUNT),
            o.number("total", 0.0, BAR_MAX_COUNT, optional=True),
            o.text("desc", BAR_DESC, optional=True) or "",
            o.number("elapsed_s", 0.0, 1e9),
            o.integer("pos", 0, 1 << 16, optional=True) or 0,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return {"n": self.n, "total": self.total, "desc": self.desc, "elapsed_s": self.elapsed_s, "pos": self.pos}


@dataclass(frozen=True)
class UpdateInfo:
    """Whether the stepped optimizer's steps change the model, read by the hook at its progress
    records (every 2 s at most, at a step boundary, on the training's thread): each parameter
    tensor's ``.grad`` (``None`` or not) and ``_version`` (the in-place write counter autograd
    keeps on the CPU: an optimizer step writes every parameter it updates, so the counter moves),
    each group's ``lr`` when it is a Python number. No tensor's values are read: nothing waits for
    a device.

    Attributes:
        params: parameter tensors of the optimizer looked at (at most :data:`PARAMS_SCANNED`).
        with_grad: of those, how many had a ``.grad`` at the last record.
        lr_max: the largest learning rate of the groups; ``None``: one is not a Python number
            (a tensor learning rate is not read).
        still_steps: optimizer steps since the last record at which the steps changed a parameter
            (0: the last interval changed one).
        still_s: s from the first of those records to this one.
        why: why they changed nothing (:data:`STILL_WHY`; ``""`` while they do).
    """

    params: int
    with_grad: int
    lr_max: float | None
    still_steps: int = 0
    still_s: float = 0.0
    why: str = ""

    @classmethod
    def decode(cls, value: object, where: str) -> UpdateInfo:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            o.integer("params", 0, PARAMS_SCANNED),
            o.integer("with_grad", 0, PARAMS_SCANNED),
            o.number("lr_max", -1e30, 1e30, optional=True),
            o.integer("still_steps", 0, _U63, optional=True) or 0,
            o.number("still_s", 0.0, 1e10, optional=True) or 0.0,
            o.text("why", 16, optional=True, choices=STILL_WHY) or "",
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return {
            "params": self.params,
            "with_grad": self.with_grad,
            "lr_max": self.lr_max,
            "still_steps": self.still_steps,
            "still_s": self.still_s,
            "why": self.why,
        }


@dataclass(frozen=True)
class ProgressInfo:
    """Where the training is, as its hook sees it.

    Attributes:
        epoch: iterators made over the busiest DataLoader since the hook started (its
            ``__iter__`` calls, persistent workers included), counted from 1; ``None`` before one.
            Under ``attach`` the epoch running when the hook got in is not counted: the next is 1.
        batch: batches taken from that iterator (the position in the epoch, counted from 1).
        epoch_len: ``len(loader)`` in batches; ``None``: not known (an ``IterableDataset``
            without ``__len__``).
        loss: the last :data:`LOSS_HISTORY` loss readings, oldest first.
        first_nonfinite: the first reading that was NaN or ±inf, kept for good.
        loss_note: why there is no loss (a non-scalar ``backward()``, ``backward(gradient=...)``),
            said once; ``""`` otherwise.
        bars: the training's live ``tqdm`` bars, outermost first, at most :data:`BARS_MAX`
            (what the script shows its user: the run's total where a bar counts it).
        at: when the hook made this record, monotonic s (``None`` from an older hook): the
            batch and the bars are as of then, which may be seconds before torchwatch reads it.
        updates: whether the optimizer's steps change the parameters (``None``: no optimizer
            step yet, or an older hook).
    """

    epoch: int | None = None
    batch: int = 0
    epoch_len: int | None = None
    loss: tuple[LossSample, ...] = ()
    first_nonfinite: LossSample | None = None
    loss_note: str = ""
    bars: tuple[BarInfo, ...] = ()
    at: float | None = None
    updates: UpdateInfo | None = None

    @classmethod
    def decode(cls, value: object, where: str) -> ProgressInfo:
        """Raises: WireError."""
        o = _Obj(value, where)
        first = o.d.get("first_nonfinite")
        updates = o.d.get("updates")
        return cls(
            o.integer("epoch", 0, _U63, optional=True),
            o.integer("batch", 0, _U63, optional=True) or 0,
            o.integer("epoch_len", 0, _U63, optional=True),
            tuple(LossSample.decode(v, w) for v, w in o.items("loss", LOSS_HISTORY)),
            None if first is None else LossSample.decode(first, f"{where}.first_nonfinite"),
            o.text("loss_note", TEXT, optional=True) or "",
            tuple(BarInfo.decode(v, w) for v, w in o.items("bars", BARS_MAX)),
            o.number("at", 0.0, 1e10, optional=True),
            None if updates is None else UpdateInfo.decode(updates, f"{where}.updates"),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "epoch_len": self.epoch_len,
            "loss": [s.to_json() for s in self.loss],
            "first_nonfinite": None if self.first_nonfinite is None else self.first_nonfinite.to_json(),
            "loss_note": self.loss_note,
            "bars": [b.to_json() for b in self.bars],
            "at": self.at,
            "updates": None if self.updates is None else self.updates.to_json(),
        }
