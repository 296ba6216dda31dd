"""What the stall / hang recorder found: every thread of every rank and DataLoader worker,
dumped once when the training stopped stepping, and what that says (:class:`HangView`).

Built by :mod:`torchwatch.watch.hang` (from :mod:`torchwatch.analysis.hang`'s threshold and
summary and py-spy's dumps); faces read it from the Observation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torchwatch.model.readings import Frame
from torchwatch.model.text import escape

__all__ = ["DumpedThread", "HangProcess", "HangView", "ProcessDump", "frame_text"]


def frame_text(frame: Frame | None) -> str | None:
    """``name (file:line)`` as py-spy prints a frame; ``None`` for no frame. The names are the
    target's text: a character that is not printable is escaped (:func:`~torchwatch.model.text.escape`)."""
    return None if frame is None else f"{escape(frame.name)} ({escape(frame.filename)}:{frame.line})"


@dataclass(frozen=True)
class DumpedThread:
    """One thread as ``py-spy dump`` saw it.

    Attributes:
        tid: its OS thread id (the main thread's is the process's PID). name: its Python name.
        active: py-spy saw it running (not idle in a wait).
        frames: outermost call first, the leaf last (as :class:`~torchwatch.model.readings.StackSample`).
    """

    tid: int
    name: str
    active: bool
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class ProcessDump:
    """The dump of one process.

    Attributes:
        pid: the process (torchwatch's PID namespace). role: ``rank`` (a rank of a job),
            ``training`` (the training process of a single-process run) or ``worker`` (a
            DataLoader worker). rank: its rank (``None``: not a rank). parent: a worker's
            training process (``None`` for the others).
        threads: every thread, the main thread first. error: why the dump failed (one line),
            ``None`` when it worked. dump_s: the dump's wall time, s.
    """

    pid: int
    role: str
    rank: int | None = None
    parent: int | None = None
    threads: tuple[DumpedThread, ...] = ()
    error: str | None = None
    dump_s: float = 0.0

    @property
    def main_thread(self) -> DumpedThread | None:
        """The thread whose id is the PID, else the first one (``None``: no threads dumped)."""
        return next((t for t in self.threads if t.tid == self.pid), self.threads[0] if self.threads else None)


@dataclass(frozen=True)
class HangProcess:
    """What one process's main thread does in the dump.

    Attributes:
        pid / role / rank / parent: as in :class:`ProcessDump`.
        state: ``collective`` (in a torch.distributed collective or ``Work.wait``),
            ``backward`` (a rank in its backward pass: under DDP the gradient all-reduce waits
            there, which Python frames alone cannot tell from backward compute),
            ``dataloader`` (waiting on its DataLoader), ``idle`` (a worker waiting for indices),
            ``busy`` (a worker in the dataset or collate), ``elsewhere``, or ``unknown`` (no dump).
        where: the frame that decided the state, ``name (file:line)``.
        top_frame: the innermost frame outside the standard library and site-packages (the
            user's code), ``name (file:line)``; ``None`` when the stack has none.
        error: why there is no dump (one line).
    """

    pid: int
    role: str
    rank: int | None
    parent: int | None
    state: str
    where: str | None = None
    top_frame: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class HangView:
    """A recorded hang, or the stall it became once the training stepped again.

    Times are seconds since watching started.

    Attributes:
        state: ``hang`` (no step since), ``stall`` (it resumed: the hang became a stall of
            :attr:`stalled_s`), ``dumping`` (threads are being dumped).
        pid / rank: the process whose step clock ran out first (``None`` rank: not a rank).
        threshold_s: seconds without a step that count as a hang. threshold_from: where it came
            from (``--hang-after`` or ``max(30 s, 20 x p95 step)`` with its p95).
        last_step_s: when that process's last step ended. fired_s: when the recorder fired.
        detected_after_s: ``fired_s - last_step_s``.
        stalled_s: seconds without a step: until now (hang), or until the first step after it.
        resumed_s: when the training stepped again (``None``: not yet).
        processes: one row per rank, training process and DataLoader worker dumped.
        odd_one_out: the process the summary names as the likely cause, ``None`` when none stands out.
        summary: one line saying who waits where and who is elsewhere.
        dump_s: wall seconds all the dumps took together (py-spy pauses each process only for its own dump).
        dumps: the dumps themselves (every thread), for the hang file.
        number: how many hangs this watch recorded, this one included (one per stall).
        progress: where that process's training was when its clock ran out, as its hook last
            published it: ``epoch E, batch B/N, loss X at step S`` (``""``: no hook progress).
    """

    state: str
    pid: int
    rank: int | None
    threshold_s: float
    threshold_from: str
    last_step_s: float
    fired_s: float
    detected_after_s: float
    stalled_s: float
    resumed_s: float | None = None
    processes: tuple[HangProcess, ...] = ()
    odd_one_out: HangProcess | None = None
    summary: str = ""
    dump_s: float = 0.0
    dumps: tuple[ProcessDump, ...] = ()
    number: int = 1
    progress: str = ""

    def to_json(self) -> dict[str, Any]:
        """The report's ``hang`` key: every field but the dumps' frames, which go to the hang file
        (threads are counted per process)."""
        out = asdict(self)
        out["dumps"] = [
            {
                "pid": d.pid,
                "role": d.role,
                "rank": d.rank,
                "threads": len(d.threads),
                "error": d.error,
                "dump_s": d.dump_s,
            }
            for d in self.dumps
        ]
        return out
