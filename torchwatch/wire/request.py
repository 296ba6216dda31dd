"""``request.json``, written by torchwatch before its signal and decoded once by the hook into
one typed :data:`Request` (:func:`decode_request`): a burst's bounds (:class:`BurstRequest`, the
request without ``"kind"``, each bound clamped to a safe range when read), a live trial
(:class:`~torchwatch.wire.trial.TrialRequest`, ``"kind": "trial"``; one that does not decode is
a :class:`BadTrial`, refused with why) or the end of one (:class:`TrialStop`); and the name a
multi-rank burst's traces share (:func:`group_name_ok`)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .base import _U63, TEXT, WireError, clean_text
from .settings import VALUE_TEXT
from .trial import TRIAL_KIND, TRIAL_STOP_KIND, TrialRequest

__all__ = ["BadTrial", "BurstRequest", "Request", "TrialStop", "decode_request", "group_name_ok"]


@dataclass(frozen=True)
class BurstRequest:
    """Bounds of one burst (``request.json``, written by torchwatch before the signal).

    Attributes:
        warmup: steps profiled but discarded first (the profiler's own start-up cost lands there).
        steps: active steps recorded (at most 20).
        max_s: seconds after which the burst stops at the next step boundary (or in time-window
            mode, at the deadline).
        window_s: length of a time-window burst, for processes that make no optimizer steps.
        max_bytes: a larger exported trace is deleted before it is read (no summary).
        arm_timeout_s: seconds to wait for a step boundary before falling back to a time window.
        start_step: the step (0-based, as counted by the hook) at which the burst starts, so that
            every rank of a job profiles the same steps; ``None``: the next step. A rank already
            past it starts at its next step and says so (``BurstResult.first_step``).
        group: a name shared by the bursts of all ranks (:func:`group_name_ok`): their traces go
            to one folder, ``<trace dir>/<group>/``, one file per rank (what HolisticTraceAnalysis
            reads as one multi-rank trace). ``None``: the process's own folder.
    """

    warmup: int = 1
    steps: int = 3
    max_s: float = 10.0
    window_s: float = 2.0
    max_bytes: int = 200 * 1024 * 1024
    arm_timeout_s: float = 3.0
    start_step: int | None = None
    group: str | None = None

    @classmethod
    def from_request(cls, req: Mapping[str, Any] | None) -> BurstRequest:
        """Params from a ``request.json`` dict, each value clamped to a safe range (a wrong
        type or a non-finite number gives the default)."""
        d = cls()
        if not req:
            return d

        def num(key: str, lo: float, hi: float, default: float) -> float:
            v = req.get(key, default)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                return default
            return min(hi, max(lo, float(v)))

        return cls(
            warmup=int(num("warmup", 0, 5, d.warmup)),
            steps=int(num("steps", 1, 20, d.steps)),
            max_s=num("max_s", 0.5, 60.0, d.max_s),
            window_s=num("window_s", 0.2, 30.0, d.window_s),
            max_bytes=int(num("max_bytes", 1e6, 2e9, d.max_bytes)),
            arm_timeout_s=num("arm_timeout_s", 0.5, 60.0, d.arm_timeout_s),
            start_step=_count_or_none(req.get("start_step")),
            group=req["group"] if group_name_ok(req.get("group")) else None,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return dict(self.__dict__)


_GROUP = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def group_name_ok(name: object) -> bool:
    """Whether ``name`` may name a burst group: 1 to 64 of ``A-Z a-z 0-9 _ . -``, not only dots
    (it becomes a folder name: no ``/``, no ``.`` or ``..``)."""
    return isinstance(name, str) and _GROUP.match(name) is not None and name.strip(".") != ""


def _count_or_none(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _U63 else None


@dataclass(frozen=True)
class TrialStop:
    """End the running trial now (``request.json`` with ``"kind": "trial-stop"``: torchwatch
    was stopped). ``id``: the trial's (:class:`~torchwatch.wire.trial.TrialRequest`), 0 when
    the request's is not a valid one (it then ends no trial)."""

    id: int

    def to_json(self) -> dict[str, Any]:
        """The JSON object, with ``"kind": "trial-stop"``."""
        return {"kind": TRIAL_STOP_KIND, "id": self.id}


@dataclass(frozen=True)
class BadTrial:
    """A ``"kind": "trial"`` request that does not decode: the hook refuses it with ``why``.

    Attributes:
        id: the request's id when it is one (1 to 2**31), else 1.
        setting / value: the request's, as text (cleaned, ``""`` when missing).
        why: the decoder's one line (:class:`~torchwatch.wire.base.WireError`).
    """

    id: int
    setting: str
    value: str
    why: str


Request = BurstRequest | TrialRequest | TrialStop | BadTrial
"""One decoded ``request.json`` (:func:`decode_request`)."""


def decode_request(raw: object) -> Request | None:
    """``request.json``'s JSON value as a typed request; ``None`` when it is not a JSON object
    (the hook then acts as without a request). Never raises: a burst's bounds are clamped
    (:meth:`BurstRequest.from_request`), a trial that does not decode is a :class:`BadTrial`.
    A ``"kind"`` other than ``"trial"`` or ``"trial-stop"`` is a burst's request."""
    if not isinstance(raw, dict):
        return None
    kind = raw.get("kind")
    if kind == TRIAL_STOP_KIND:
        return TrialStop(_trial_id(raw.get("id")) or 0)
    if kind != TRIAL_KIND:
        return BurstRequest.from_request(raw)
    try:
        return TrialRequest.decode(raw)
    except WireError as exc:
        return BadTrial(
            _trial_id(raw.get("id")) or 1,
            clean_text(str(raw.get("setting", "")), 40),
            clean_text(str(raw.get("value", "")), VALUE_TEXT),
            clean_text(f"bad request: {exc}", TEXT),
        )


def _trial_id(v: object) -> int | None:
    """``v`` when it is a trial's id (an int from 1 to 2**31, not a bool), else ``None``."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1 << 31 else None
