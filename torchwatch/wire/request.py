"""The burst request (``request.json`` without ``"kind"``, written by torchwatch before its
signal): the bounds of one burst (:class:`BurstRequest`), each clamped to a safe range when read,
and the name a multi-rank burst's traces share (:func:`group_name_ok`)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .base import _U63

__all__ = ["BurstRequest", "group_name_ok"]


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
