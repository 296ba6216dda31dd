"""A live trial's plan and outcome, and its result in words (:func:`verdict`): what
``torchwatch trial``, the report, ``compare`` and the TUI show. Run by :mod:`torchwatch.watch.trials`;
the trial itself runs in the hook (:mod:`torchwatch.hook.trial`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchwatch import wire

__all__ = ["NEGLIGIBLE", "UNSTEADY", "Outcome", "Plan", "verdict"]


@dataclass(frozen=True)
class Plan:
    """What the request asks, and why.

    Attributes:
        request: the request sent to every rank.
        typical_step_s: the median of the last steps' durations the plan was made from, s.
    """

    request: wire.TrialRequest
    typical_step_s: float | None


@dataclass
class Outcome:
    """What a trial gave: each rank's final state (or why it has none).

    Attributes:
        plan: the plan sent.
        states: PID -> the rank's last published trial state (``None``: none with our id).
        exited: PIDs that exited during the trial (their hook's files went with them).
        not_sent: PID -> why the request could not be sent.
        stopped_by: the signal that stopped torchwatch during the trial, else ``None``.
        ranks: PID -> global rank, where the hook knows it.
    """

    plan: Plan
    states: dict[int, wire.TrialState | None] = field(default_factory=dict)
    exited: list[int] = field(default_factory=list)
    not_sent: dict[int, str] = field(default_factory=dict)
    stopped_by: int | None = None
    ranks: dict[int, int] = field(default_factory=dict)

    def headline(self) -> tuple[int, wire.TrialState] | None:
        """The state that speaks for the job: the lowest rank's ended state that measured
        something (ranks of a synchronous job share the step time), else any ended state."""
        ended = [(pid, st) for pid, st in self.states.items() if st is not None and st.finished]
        if not ended:
            return None
        ended.sort(key=lambda p: (p[1].estimate is None, self.ranks.get(p[0], 1 << 30), p[0]))
        return ended[0]

    def to_json(self) -> dict[str, Any]:
        """The JSON object (``torchwatch trial --json``, and the report's ``trials`` entries)."""
        head = self.headline()
        return {
            "request": self.plan.request.to_json(),
            "typical_step_s": self.plan.typical_step_s,
            "verdict": None if head is None else verdict(head[1]),
            "ranks": [
                {"pid": pid, "rank": self.ranks.get(pid), "trial": None if st is None else st.to_json()}
                for pid, st in sorted(self.states.items())
            ],
            "exited": sorted(self.exited),
            "not_sent": {str(k): v for k, v in sorted(self.not_sent.items())},
            "stopped_by": self.stopped_by,
        }


NEGLIGIBLE = 0.03  # an interval inside ±3 % is "no difference": below what a user would act on
UNSTEADY = 0.15  # an interval wider than ±15 % decides nothing


def verdict(state: wire.TrialState) -> dict[str, Any]:
    """The result in words and numbers: ``{"result", "text", "speedup", "lo", "hi", "pm"}``.

    ``result`` is ``faster``, ``slower``, ``no difference``, ``undecided`` (interval wider than
    ±:data:`UNSTEADY`), or the state (``refused``, ``failed``) when nothing was measured.
    """
    est = state.estimate
    name = f"{state.setting}={state.value}"
    if est is None:
        why = state.reason or state.state
        return {"result": state.state if state.state in ("refused", "failed") else "undecided",
                "text": f"{name}: no result ({why})", "speedup": None, "lo": None, "hi": None, "pm": None}  # fmt: skip
    pm = max(abs(1 - est.lo), abs(est.hi - 1))
    interval = f"95 % interval {est.lo:.2f}-{est.hi:.2f}x, {est.pairs} pairs of blocks"
    if est.lo >= 1 - NEGLIGIBLE and est.hi <= 1 + NEGLIGIBLE:
        result, text = "no difference", f"{name}: no difference within ±{pm:.0%} ({interval})"
    elif est.half_width > UNSTEADY:
        result, text = "undecided", f"{name}: not steady enough to decide: {est.speedup:.2f}x ({interval})"
    elif est.lo > 1:
        result, text = "faster", f"{name}: {est.speedup:.2f}x faster steps ({interval})"
    elif est.hi < 1:
        result, text = "slower", f"{name}: {1 / est.speedup:.2f}x slower steps ({interval})"
    else:
        result, text = "no difference", f"{name}: no difference within ±{pm:.0%} ({interval})"
    return {"result": result, "text": text, "speedup": est.speedup, "lo": est.lo, "hi": est.hi, "pm": pm}
