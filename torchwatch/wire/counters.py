"""The ``counters`` file's binary layout (little-endian, :data:`COUNTERS_SIZE` bytes: a header,
then a ring of the last :data:`RING` steps), its versioning (:data:`COUNTERS_VERSION`: a reader of
another version refuses the file with a one-line reason) and its decoder
(:func:`decode_counters`: one consistent :class:`CounterSnapshot`, per step a :class:`RankStep`).
The hook writes it in place through ``mmap`` under a sequence lock
(:class:`~torchwatch.wire.counterfile.Counters`)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import NamedTuple

from .base import _TIME_MAX, _U63, WireError
from .identity import Instance

__all__ = [
    "COUNTERS_MAGIC",
    "COUNTERS_SIZE",
    "COUNTERS_VERSION",
    "DYNAMIC",
    "DYNAMIC_OFFSET",
    "ENTRY",
    "HEADER",
    "IDENTITY",
    "RING",
    "SEQ",
    "SEQ_OFFSET",
    "STEP_SOURCES",
    "Busy",
    "CounterSnapshot",
    "RankStep",
    "decode_counters",
]


STEP_SOURCES = ("", "optimizer", "backward")  # where step boundaries come from; "": not known yet

COUNTERS_MAGIC = b"TWH3"
COUNTERS_VERSION = 3  # 3: step source, backward and collective totals, per-step backward/collective times
# magic, version, seq, pid, start (ticks), pid namespace inode, steps, batches, ring capacity,
# ring written, last step end (s), data wait total (s), step time total (s), in-next since
# (s, 0 = not in next), last batch end (s), first step end (s), step source (index in
# STEP_SOURCES), backward calls, collective calls, backward wall total (s), backward blocked
# total (s), collective wait total (s), in-backward since (s, 0 = not in one), in-collective
# since (s, 0 = not in one)
HEADER = struct.Struct("<4sIQQQQQQQQddddddQQQddddd")
SEQ = struct.Struct("<Q")  # the header's seq field, at offset 8
SEQ_OFFSET = 8
IDENTITY = struct.Struct("<4sI8xQQQ")  # magic, version, (seq), pid, start, pidns: written once
DYNAMIC = struct.Struct("<QQQQddddddQQQddddd")  # steps ... in-collective since: rewritten at every update
DYNAMIC_OFFSET = IDENTITY.size
assert IDENTITY.size + DYNAMIC.size == HEADER.size
# step end (monotonic s), step duration, data wait, backward wall, backward blocked, collective wait (s)
ENTRY = struct.Struct("<dddddd")
RING = 512
COUNTERS_SIZE = HEADER.size + RING * ENTRY.size


class RankStep(NamedTuple):
    """One step of one rank, as the counters hold it (all in s; ``end`` is monotonic).

    Attributes:
        end: when the step ended (an optimizer step, or the end of a backward pass).
        duration: from the previous step's end to this one's.
        data_wait: blocked in DataLoader ``__next__``.
        backward: wall time of ``torch.autograd.backward`` calls in the step.
        backward_blocked: the part of ``backward`` in which the calling thread used no CPU
            (wall minus ``time.thread_time()``). With DDP on CPU this is the wait for the
            gradient all-reduce that DDP's reducer runs inside backward (see
            :meth:`collective_wait`).
        collective: blocked in explicit ``torch.distributed`` collectives and ``Work.wait()``
            called outside backward.
    """

    end: float
    duration: float
    data_wait: float
    backward: float
    backward_blocked: float
    collective: float

    def collective_wait(self, backward_blocked_is_comm: bool) -> float:
        """Time blocked on peers in the step, s: explicit collectives, plus the blocked part of
        backward when that is the reducer's all-reduce.

        Args:
            backward_blocked_is_comm: count ``backward_blocked`` as collective wait. True for a
                distributed training whose backward runs on the CPU (CUDA not initialised): the
                autograd engine then runs backward on the calling thread, and what blocks it is
                DDP's wait for its bucket all-reduces. On a GPU the engine runs backward on its
                device threads and the caller blocks for all of it: say False (collectives on
                the GPU are asynchronous; a burst shows their kernels). The estimate counts an
                OpenMP thread's spin-wait as CPU (so it is low with several intra-op threads)
                and a descheduled thread as blocked (so it is high on an oversubscribed CPU).
        """
        return self.collective + (self.backward_blocked if backward_blocked_is_comm else 0.0)

    def before_collective(self) -> float:
        """What the rank does in the step besides loading data, backward and collectives, s:
        the step minus data wait, backward wall and explicit collectives (forward, optimizer
        and other host work). In synchronous data parallelism every rank's step lasts as long
        as the slowest's, so the step itself names no straggler; the rank that arrives last at
        the gradient all-reduce does (HolisticTraceAnalysis's straggler analysis: the rank whose
        last collective starts latest; TraceML: the rank with the shortest backward, which
        includes the wait). ``data_wait + before_collective()`` is how long a rank takes to
        reach its backward pass; the rank with the longest is the straggler, and the larger
        of the two parts says why."""
        return max(0.0, self.duration - self.data_wait - self.backward - self.collective)


@dataclass(frozen=True)
class CounterSnapshot:
    """One consistent read of the hook's counters. Times are ``time.monotonic()`` seconds (the
    same clock in every process of the machine), durations in s.

    Attributes:
        instance: the training process that writes them.
        steps: step boundaries since the hook started (optimizer steps, or backward passes:
            ``step_source``).
        batches: batches taken from DataLoader iterators.
        last_step_t: when the last step ended (0.0: none yet).
        first_step_t: when the first step ended (0.0: none yet).
        data_wait_s: total time blocked in DataLoader ``__next__``.
        step_time_s: total duration of the steps (from the first step end on).
        in_next_since: when the ``__next__`` now running began (0.0: not in one).
        last_batch_t: when the last batch arrived (0.0: none yet).
        entries: the last up-to-:data:`RING` steps as ``(end, duration, data wait)``, oldest first
            (read with ``since``: those written after it).
        step_source: where the step boundaries come from (:data:`STEP_SOURCES`). It changes at
            most once after it is set: from ``backward`` to ``optimizer`` when a loop that made
            no optimizer step for a while makes one (its first steps were backward passes).
        backward_calls, backward_s, backward_blocked_s: ``torch.autograd.backward`` calls of the
            main thread, their total wall time and the part of it spent blocked (no CPU), s.
        collective_calls, collective_s: explicit ``torch.distributed`` collectives (and
            ``Work.wait()``) of the main thread outside backward, and the time blocked in them, s.
        in_backward_since, in_collective_since: when the backward pass or collective now
            running began (0.0: not in one), so a rank stuck on a dead peer shows while it lasts.
        details: for each of ``entries``, ``(backward, backward blocked, collective)``, s
            (see :meth:`rank_steps`).
        written: step entries written since the hook started (the ring holds the last
            :data:`RING`); a reader passes it back as ``since`` to decode only newer ones.
    """

    instance: Instance
    steps: int
    batches: int
    last_step_t: float
    first_step_t: float
    data_wait_s: float
    step_time_s: float
    in_next_since: float
    last_batch_t: float
    entries: tuple[tuple[float, float, float], ...]
    step_source: str = ""
    backward_calls: int = 0
    backward_s: float = 0.0
    backward_blocked_s: float = 0.0
    collective_calls: int = 0
    collective_s: float = 0.0
    in_backward_since: float = 0.0
    in_collective_since: float = 0.0
    details: tuple[tuple[float, float, float], ...] = ()
    written: int = 0

    @property
    def pid(self) -> int:
        """The writer's PID (in its own namespace)."""
        return self.instance.pid

    def rank_steps(self) -> tuple[RankStep, ...]:
        """The steps of :attr:`entries` with their backward and collective times, oldest first."""
        details = self.details if len(self.details) == len(self.entries) else ((0.0, 0.0, 0.0),) * len(self.entries)
        return tuple(RankStep(*e, *d) for e, d in zip(self.entries, details, strict=True))


class Busy(WireError):
    """The counters were being written (odd sequence number, or it changed while read)."""


def decode_counters(data: bytes, again: bytes, expect: Instance | None = None, since: int = 0) -> CounterSnapshot:
    """Decode a ``counters`` file read twice (the whole file, then its header again).

    Args:
        data: the file's :data:`COUNTERS_SIZE` bytes. again: its header, read after ``data``.
        expect: the process that must have written it (``None``: any).
        since: the ``written`` count of the caller's previous snapshot: only the step entries
            written after it are decoded and checked (a reader once a second decodes its new
            steps, not the whole ring: the whole ring was 4.5 ms of a 7 ms read at 125 steps/s).
            0, or more than the file's count: every entry in the ring.

    Raises:
        Busy: a write was in progress (read again). WireError: wrong size, magic, version,
            ring, writer, or a value that is not a count or a clock reading.
    """
    if len(data) != COUNTERS_SIZE or len(again) < HEADER.size:
        raise WireError(f"counters: {len(data)} bytes, expected {COUNTERS_SIZE}")
    head = HEADER.unpack_from(data, 0)
    magic, version, seq, pid, start, ns, steps, batches, ring, written = head[:10]
    if magic != COUNTERS_MAGIC or version != COUNTERS_VERSION:
        raise WireError(f"counters: not a torchwatch counters file of version {COUNTERS_VERSION}")
    if seq % 2 or seq != SEQ.unpack_from(again, SEQ_OFFSET)[0]:
        raise Busy("counters: being written")
    inst = Instance(pid, start, ns)
    if expect is not None and inst != expect:
        raise WireError(f"counters: written by process {inst.dir_name}, not {expect.dir_name}")
    source, bw_calls, coll_calls = head[16:19]
    if ring != RING or max(written, steps, batches, bw_calls, coll_calls) > _U63 or source >= len(STEP_SOURCES):
        raise WireError("counters: bad ring, counts or step source")
    times = head[10:16] + head[19:]
    if not all(math.isfinite(t) and 0.0 <= t <= _TIME_MAX for t in times):
        raise WireError("counters: a time is not a clock reading")
    last_step, wait, step_time, in_next, last_batch, first, bw_s, bw_blocked, coll_s, in_bw, in_coll = times
    begin = written - min(written, ring)
    if 0 < since <= written:
        begin = max(begin, since)
    rows = [ENTRY.unpack_from(data, HEADER.size + (i % ring) * ENTRY.size) for i in range(begin, written)]
    if not all(math.isfinite(x) and abs(x) <= _TIME_MAX for e in rows for x in e):
        raise WireError("counters: a step entry is not a clock reading")
    return CounterSnapshot(
        inst, steps, batches, last_step, first, wait, step_time, in_next, last_batch,
        entries=tuple(r[:3] for r in rows),
        step_source=STEP_SOURCES[source],
        backward_calls=bw_calls,
        backward_s=bw_s,
        backward_blocked_s=bw_blocked,
        collective_calls=coll_calls,
        collective_s=coll_s,
        in_backward_since=in_bw,
        in_collective_since=in_coll,
        details=tuple(r[3:] for r in rows),
        written=written,
    )  # fmt: skip
