"""The stall / hang recorder's logic: when a process counts as hung, and what a dump of every
rank and DataLoader worker says about it. Pure functions of step times, the clock and dumps.

A hang here is a process that *has stepped* and then makes no step for longer than
:func:`threshold`: ``max(30 s, 20 x p95 of its own step times)``, or ``--hang-after``.

- 30 s: far below the time a stuck collective takes to fail by itself (PyTorch's default
  process-group timeout, ``torch.distributed.constants.default_pg_timeout``, is 30 min; NCCL's,
  ``default_pg_nccl_timeout`` in CUDA builds, 10 min), so the dump comes while the job still
  hangs; and above the pauses a healthy training makes (a checkpoint save, an evaluation pass,
  a DataLoader's workers starting each epoch take seconds).
- 20 x p95: the p95 already holds the slow steps of the training's own noise (data hiccups,
  periodic logging); a gap 20 times that is far outside it, so a slow training (minutes per
  step) is not called hung for one slow step.

Before its first measured step a process is not armed: a training that never steps (still
loading data or compiling, or stuck before its loop) is no hang of this kind; nothing fires.
One stall fires once: the recorder stays quiet until the process that fired steps again (the
hang then becomes a stall of N s), and a new stall may fire after that.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from torchwatch.analysis.stacks import data_part, top_frame
from torchwatch.model.hang import HangProcess, ProcessDump, frame_text
from torchwatch.model.readings import Frame

__all__ = [
    "MIN_HANG_S",
    "P95_FACTOR",
    "HangDetector",
    "StepClock",
    "classify",
    "odd_one_out",
    "summary_line",
    "threshold",
]

MIN_HANG_S = 30.0  # see the module docstring
P95_FACTOR = 20.0
KEEP_STEPS = 512  # step times kept per process for its p95


def threshold(durations: Sequence[float], hang_after: float | None = None) -> tuple[float, str] | None:
    """Seconds without a step that count as a hang, and where that number comes from.

    Args:
        durations: the process's step times, s (any order).
        hang_after: ``--hang-after`` seconds; wins when given.

    Returns:
        ``(seconds, source)``; ``None`` when the process has no measured step (not armed).
    """
    if not durations:
        return None
    if hang_after is not None:
        return hang_after, f"--hang-after {hang_after:g} s"
    p95 = p95_of(durations)
    return max(MIN_HANG_S, P95_FACTOR * p95), f"max({MIN_HANG_S:g} s, {P95_FACTOR:g} x p95 step {p95 * 1000:.0f} ms)"


def p95_of(values: Sequence[float]) -> float:
    """The 95th percentile (inclusive method; the value itself for one)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


class StepClock:
    """One process's steps: their durations (the last :data:`KEEP_STEPS`) and the last end.

    Args:
        hang_after: ``--hang-after`` seconds, ``None`` for the derived threshold.
    """

    def __init__(self, hang_after: float | None = None) -> None:
        self.hang_after = hang_after
        self.durations: deque[float] = deque(maxlen=KEEP_STEPS)
        self.last_end: float | None = None

    def add(self, steps: Iterable[tuple[float, float]]) -> None:
        """Steps that ended: ``(end, duration)``, monotonic s and s; older ends than the last are ignored."""
        for end, duration in steps:
            if self.last_end is not None and end <= self.last_end:
                continue
            self.durations.append(max(0.0, duration))
            self.last_end = end

    def threshold(self) -> tuple[float, str] | None:
        """See :func:`threshold` (``None``: not armed)."""
        return threshold(list(self.durations), self.hang_after)

    def overdue(self, now: float) -> float | None:
        """Seconds since the last step when more than the threshold, else ``None`` (also when not armed)."""
        limit = self.threshold()
        if limit is None or self.last_end is None:
            return None
        idle = now - self.last_end
        return idle if idle > limit[0] else None


@dataclass(frozen=True)
class Fired:
    """The recorder fired: ``pid``'s clock ran out at ``now`` (monotonic s) after its last step at
    ``last_end`` (monotonic s); ``threshold_s`` and where it came from."""

    pid: int
    now: float
    last_end: float
    threshold_s: float
    threshold_from: str


class HangDetector:
    """The step clocks of every process, and the one-fire-per-stall rule (module docstring).

    Args:
        hang_after: ``--hang-after`` seconds, ``None`` for the derived threshold.
    """

    def __init__(self, hang_after: float | None = None) -> None:
        self.hang_after = hang_after
        self.clocks: dict[int, StepClock] = {}
        self.fired: Fired | None = None  # the stall being recorded, until its process steps again
        self.resumed_at: float | None = None

    def add(self, pid: int, steps: Iterable[tuple[float, float]]) -> None:
        """Steps of ``pid`` that ended: ``(end, duration)``, monotonic s and s."""
        clock = self.clocks.setdefault(pid, StepClock(self.hang_after))
        clock.add(steps)
        fired = self.fired
        if fired is not None and pid == fired.pid and clock.last_end is not None and clock.last_end > fired.last_end:
            self.resumed_at = clock.last_end

    def forget(self, pid: int) -> None:
        """``pid`` exited: its clock goes (a PID may be reused)."""
        self.clocks.pop(pid, None)

    def check(self, now: float) -> Fired | None:
        """The stall to record now, or ``None``: none, or the one recorded has not ended (one fire
        per stall). A stall that ended (its process stepped again) lets a new one fire."""
        if self.fired is not None and self.resumed_at is None:
            return None
        late = [(idle, pid) for pid, c in self.clocks.items() if (idle := c.overdue(now)) is not None]
        if not late:
            return None
        _, pid = max(late)
        clock = self.clocks[pid]
        limit = clock.threshold()
        assert limit is not None and clock.last_end is not None
        self.fired, self.resumed_at = Fired(pid, now, clock.last_end, limit[0], limit[1]), None
        return self.fired


# -- reading the dumps ---------------------------------------------------------------------
_COLLECTIVE_FILES = ("torch/distributed/", "torch/nn/parallel/distributed.py")
_WORKER_LOOP = "torch/utils/data/_utils/worker.py"


# the hook's wrappers (and the channel's writers they call) sit in the training's stacks: not the user's code
_OWN_FILES = ("/torchwatch/hook/", "/torchwatch/wire/")


def _norm(filename: str) -> str:
    return filename.replace("\\", "/")


def user_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame of the user's code: outside the standard library, site-packages and
    torchwatch's hook (:func:`~torchwatch.analysis.stacks.top_frame` less the hook's and its channel's frames)."""
    return top_frame([f for f in frames if not any(p in _norm(f.filename) for p in _OWN_FILES)])


def _innermost(frames: Sequence[Frame], parts: Sequence[str]) -> Frame | None:
    return next((f for f in reversed(frames) if any(p in _norm(f.filename) for p in parts)), None)


def classify(dump: ProcessDump) -> HangProcess:
    """What ``dump``'s main thread does (see :class:`~torchwatch.model.hang.HangProcess`).

    A rank's backward pass counts as ``backward``: DDP launches its gradient all-reduce from
    autograd hooks and waits for it at the end of backward, in C++ frames a Python dump does not
    show (``c10d::Reducer::finalize_backward``); a backward that outlasts the hang threshold is that wait.
    """
    main = dump.main_thread
    base = {"pid": dump.pid, "role": dump.role, "rank": dump.rank, "parent": dump.parent}
    if main is None:
        return HangProcess(state="unknown", error=dump.error or "no threads dumped", **base)  # type: ignore[arg-type]
    frames = main.frames
    top = frame_text(user_frame(frames))
    state, where = "elsewhere", frames[-1] if frames else None
    if dump.role == "worker":
        busy = next((f for f in reversed(frames) if f.name.endswith(("__getitem__", "__getitems__"))), None)
        busy = busy or _innermost(frames, ("torch/utils/data/_utils/fetch.py", "torch/utils/data/_utils/collate.py"))
        if busy is not None:
            state, where = "busy", busy
        elif _innermost(frames, (_WORKER_LOOP,)) is not None:
            state, where = "idle", _innermost(frames, (_WORKER_LOOP,))
    elif (hit := _innermost(frames, _COLLECTIVE_FILES)) is not None:
        state, where = "collective", hit
    elif data_part(frames) is not None:
        state, where = "dataloader", _innermost(frames, ("torch/utils/data/dataloader.py",))
    elif dump.rank is not None and (hit := _innermost(frames, ("torch/autograd/",))) is not None:
        state, where = "backward", hit
    return HangProcess(state=state, where=frame_text(where), top_frame=top, **base)  # type: ignore[arg-type]


WAITING = ("collective", "backward")  # a rank here waits on its peers


def odd_one_out(rows: Sequence[HangProcess]) -> HangProcess | None:
    """The likely cause.

    - Several ranks: the one rank not waiting on its peers (not ``collective`` nor
      ``backward``) while the others are; ``None`` when none or several are elsewhere.
    - A training waiting on its DataLoader: the worker busy in the dataset (the first by PID
      when several are: batches come back in order, the main loop waits for one worker at a time).
    - Otherwise: the training process itself when it is ``elsewhere`` (its own code stalls).
    """
    ranks = [r for r in rows if r.rank is not None and r.role == "rank"]
    if len(ranks) >= 2:
        elsewhere = [r for r in ranks if r.state not in WAITING and r.state != "unknown"]
        if len(elsewhere) == 1 and len(ranks) - len(elsewhere) >= 1:
            return elsewhere[0]
        return None
    trainers = [r for r in rows if r.role in ("rank", "training")]
    for trainer in trainers:
        if trainer.state == "dataloader":
            busy = sorted((r for r in rows if r.parent == trainer.pid and r.state == "busy"), key=lambda r: r.pid)
            return busy[0] if busy else None
        if trainer.state == "elsewhere":
            return trainer
    return None


def _who(row: HangProcess) -> str:
    if row.role == "worker":
        return f"DataLoader worker PID {row.pid}"
    if row.rank is not None and row.role == "rank":
        return f"rank {row.rank} (PID {row.pid})"
    return f"the training (PID {row.pid})"


_DOING = {
    "collective": "waits in a collective",
    "backward": "waits in backward (DDP's gradient all-reduce)",
    "dataloader": "waits on its DataLoader",
    "idle": "waits for indices",
    "busy": "is in the dataset",
    "elsewhere": "is elsewhere",
    "unknown": "was not dumped",
}


def summary_line(rows: Sequence[HangProcess], odd: HangProcess | None) -> str:
    """One line: the likely cause with its frame, then who waits where."""
    parts = []
    if odd is not None:
        frame = odd.top_frame or odd.where or "no frame"
        if odd.role == "worker":
            parts.append(f"{_who(odd)} is stuck in the dataset at {frame}")
        else:
            parts.append(f"{_who(odd)} is the odd one out, not in a collective, at {frame}")
    for row in rows:
        if row is odd or row.role == "worker":
            continue
        parts.append(f"{_who(row)} {_DOING[row.state]}" + (f" at {row.where}" if row.where else ""))
    if odd is None:
        parts.insert(0, "no process stands out")
    return "; ".join(parts)
