"""Data from a hand-written producer: the loop's main thread waits for another thread or process
of the training that makes its batches, outside any DataLoader.

Research code often feeds its loop from a ``threading.Thread`` that fills a ``queue.Queue`` (the
pattern of prefetch_generator's ``BackgroundGenerator``), or from a ``multiprocessing.Process``
that fills a ``multiprocessing.Queue``. The loop's main thread then waits in ``queue.get()``
(``threading.Condition.wait``, a futex) or in a pipe read (``Connection.recv_bytes``), which
:mod:`torchwatch.analysis.stacks` files under "other" code and ``/proc`` under "waiting on another
thread": neither is the DataLoader, so the DataLoader rules are silent, and the loop's own CPU
(its share of the time it does not wait) was read as the cause. What that wait means is decided
here from the stacks (py-spy reads every thread of the training process) and the CPU of the
threads and processes that could be producing:

- :func:`handoff_wait`: a main-thread stack waiting on a queue, a condition, an event, a pipe or
  a future of the training's own (no torch frame in it, not joining a thread or a process);
- :func:`producer_features`: the share of the loop's samples in such waits, and the CPU the
  producers used meanwhile: the training process's other Python threads (not running the model,
  not torch's own threads) for a wait on a thread's queue, the tree's other processes for a wait
  on a pipe or a ``multiprocessing`` queue;
- :func:`producer_texts`: what the producer runs (its hottest frame of user code) or which
  processes they are, for the finding's text.

Pure functions over a :class:`~torchwatch.analysis.store.Window`, no state.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from torchwatch.analysis import stacks
from torchwatch.analysis.store import Window
from torchwatch.model.readings import Frame, Role, StackSample, ThreadSample

__all__ = ["handoff_wait", "producer_features", "producer_texts"]

# A wait on another thread of the process: queue.Queue, threading.Condition / Event / Semaphore.
_THREAD_WAIT_FILES = ("/queue.py", "/threading.py", "concurrent/futures/_base.py")
# A wait on another process: multiprocessing's Queue / SimpleQueue / Pipe / locks, and the
# selectors a Connection.poll with a timeout ends in.
_PROCESS_WAIT_FILES = (
    "multiprocessing/queues.py",
    "multiprocessing/connection.py",
    "multiprocessing/synchronize.py",
)
_SELECTORS = "/selectors.py"
# Waiting for a thread or a process to *end* (a coordinator that joins its trainers) is no
# hand-off of data.
_JOIN_NAMES = ("join", "_wait_for_tstate_lock")
# Blocked putting into a full queue, the loop waits for a *consumer* (a logger, a checkpoint
# writer): no data comes to it that way.
_PUT_NAMES = ("put", "put_nowait", "send", "send_bytes")
_TORCH = "torch/"

MODEL_SHARE = 0.2
"""A Python thread whose stacks run the model (forward, backward, optimizer) this share of its
samples or more trains: it is not a producer of data."""

BUSY_SHARE = 0.05
"""A thread or process on a CPU (or waiting for one) less than this share of the window is not
counted as producing (an idle logger, a sleeping helper)."""


def _norm(filename: str) -> str:
    return filename.replace("\\", "/")


def handoff_wait(frames: Sequence[Frame]) -> str | None:
    """What a stack of the loop's main thread waits on, when it waits for data handed over by
    another thread or process of the training outside the DataLoader.

    Returns:
        ``"thread"`` (the innermost frame is in ``queue.py``, ``threading.py`` or a
        ``concurrent.futures`` future), ``"process"`` (in ``multiprocessing``'s queues, pipes or
        locks), or ``None``: not such a wait, inside a DataLoader iterator, a stack with a torch
        frame (torch's own waits: DataLoader, compile workers, distributed), a join (waiting
        for a thread or process to end is no hand-off) or a put into a full queue (the loop then
        waits for a consumer of its own: a logger, a checkpoint writer).
    """
    if not frames or stacks.data_part(frames) is not None:
        return None
    if any(_TORCH in _norm(f.filename) and "site-packages" in _norm(f.filename) for f in frames):
        return None
    if any(f.name.rsplit(".", 1)[-1] in _JOIN_NAMES for f in frames[-3:]):
        return None
    if any(f.name.rsplit(".", 1)[-1] in _PUT_NAMES for f in frames[-4:]):
        return None
    leaf = _norm(frames[-1].filename)
    if any(part in _norm(f.filename) for f in frames[-6:] for part in _PROCESS_WAIT_FILES) and (
        leaf.endswith(_SELECTORS) or any(part in leaf for part in _PROCESS_WAIT_FILES)
    ):
        return "process"
    if leaf.endswith(_THREAD_WAIT_FILES):
        return "thread"
    return None


def _waiting(frames: Sequence[Frame]) -> bool:
    """A producer's stack that waits (on a full queue, a lock, a sleep wrapper): not its work."""
    if not frames:
        return True
    leaf = _norm(frames[-1].filename)
    return leaf.endswith((*_THREAD_WAIT_FILES, _SELECTORS)) or any(p in leaf for p in _PROCESS_WAIT_FILES)


def _busy(samples: Sequence[ThreadSample]) -> float | None:
    """Share of wall time one thread was on a CPU or ready for one, from its ``schedstat``
    counters (read once a second for every thread): ``None`` when they span < 1 s or went back."""
    timed = [s for s in samples if s.run_s is not None and s.runq_s is not None]
    if len(timed) < 2 or timed[-1].t - timed[0].t < 1.0:
        return None
    first, last = timed[0], timed[-1]
    grown = (last.run_s or 0.0) + (last.runq_s or 0.0) - (first.run_s or 0.0) - (first.runq_s or 0.0)
    return None if grown < 0 else min(1.0, grown / (last.t - first.t))


def _torch_thread(frames: Sequence[Frame]) -> bool:
    """The thread's entry (its first frame outside ``threading.py``) is torch's: the DataLoader's
    pin-memory thread, a compile worker's, a distributed helper's."""
    entry = next((f for f in frames if not _norm(f.filename).endswith("/threading.py")), None)
    return entry is not None and _TORCH in _norm(entry.filename) and "site-packages" in _norm(entry.filename)


def _producer_threads(window: Window, main_pid: int | None) -> dict[int, list[StackSample]]:
    """The training process's other Python threads that may produce data, with their stacks:
    not its main thread, not a thread of torch's (its stacks inside torch: the DataLoader's
    pin-memory thread, compile workers) and not one that runs the model (:data:`MODEL_SHARE`)."""
    by_tid: dict[int, list[StackSample]] = defaultdict(list)
    for s in window.stacks:
        if s.is_main_thread or s.role is not Role.MAIN or (main_pid is not None and s.pid != main_pid):
            continue
        by_tid[s.tid].append(s)
    out: dict[int, list[StackSample]] = {}
    for tid, samples in by_tid.items():
        total = sum(s.count for s in samples)
        model = sum(s.count for s in samples if stacks.phase(s.frames) in ("forward", "backward", "optimizer"))
        torch_own = sum(s.count for s in samples if _torch_thread(s.frames))
        if total and model < MODEL_SHARE * total and torch_own < 0.5 * total:
            out[tid] = samples
    return out


def producer_features(window: Window, main_pid: int | None, min_samples: int) -> dict[str, float | None]:
    """The loop's wait on a hand-written producer and the producers' CPU, over ``window``.

    Args:
        window: readings (from the loop's first step on, as :func:`features.compute` gives it).
        main_pid: the diagnosed training process; ``None`` takes any main.
        min_samples: main-thread stack samples below which the shares are ``None``.

    Returns:
        ``producer_wait_share``: share of the loop's main-thread samples (imports left out) in a
        :func:`handoff_wait`; ``producer_thread_wait_share`` / ``producer_process_wait_share``:
        its parts on a thread's queue and on another process; ``producer_cpu_share``: the CPU the
        producers used, share of wall time (summed, at most 1), of the kind the loop waits on
        most: the busy share (schedstat: on a CPU or waiting for one) of the process's other
        Python threads (:func:`_producer_threads`) for a thread, the mean CPU of the tree's other
        processes (not launchers or helpers; % of a core / 100) for a process; ``None`` when not
        read; ``producer_count``: the threads or processes counted busy (>= :data:`BUSY_SHARE`).
    """
    waits: Counter[str] = Counter()
    total = 0
    for s in window.stacks:
        if not s.is_main_thread or (main_pid is not None and s.pid != main_pid):
            continue
        if stacks.phase(s.frames) == "startup":
            continue
        total += s.count
        kind = handoff_wait(s.frames)
        if kind is not None:
            waits[kind] += s.count
    out: dict[str, float | None] = dict.fromkeys(
        (
            "producer_wait_share",
            "producer_thread_wait_share",
            "producer_process_wait_share",
            "producer_cpu_share",
            "producer_count",
        )
    )
    if total < min_samples:
        return out
    thread_w, process_w = waits["thread"] / total, waits["process"] / total
    out["producer_wait_share"] = thread_w + process_w
    out["producer_thread_wait_share"] = thread_w
    out["producer_process_wait_share"] = process_w
    busy = _process_busy(window, main_pid) if process_w > thread_w else _thread_busy(window, main_pid)
    if busy is not None:
        counted = [b for b in busy.values() if b >= BUSY_SHARE]
        out["producer_cpu_share"] = min(1.0, sum(counted))
        out["producer_count"] = float(len(counted))
    return out


def _thread_busy(window: Window, main_pid: int | None) -> dict[int, float] | None:
    """``{tid: busy share}`` of the possible producer threads; ``None`` when none is read."""
    tids = _producer_threads(window, main_pid)
    if not tids:
        return {}
    samples: dict[int, list[ThreadSample]] = defaultdict(list)
    for th in window.threads:
        if th.tid in tids and not th.is_main_thread and (main_pid is None or th.pid == main_pid):
            samples[th.tid].append(th)
    busy = {tid: b for tid, ss in samples.items() if (b := _busy(ss)) is not None}
    return busy if busy else None


def _process_busy(window: Window, main_pid: int | None) -> dict[int, float] | None:
    """``{pid: mean CPU, cores}`` of the tree's processes other than the diagnosed one (and not
    launchers or helpers); ``None`` without process readings."""
    if not window.processes:
        return None
    cpu: dict[int, list[float]] = defaultdict(list)
    for p in window.processes:
        if p.role in (Role.LAUNCHER, Role.HELPER) or p.cpu_pct is None:
            continue
        if (main_pid is not None and p.pid == main_pid) or (main_pid is None and p.role is Role.MAIN):
            continue
        cpu[p.pid].append(p.cpu_pct / 100.0)
    return {pid: sum(v) / len(v) for pid, v in cpu.items()}


def producer_texts(window: Window, main_pid: int | None) -> dict[str, str]:
    """What the producers run, for the finding's text: ``producer_frame``, the hottest frame of
    user code of the producer threads' working stacks (``augment (train.py:42)``: the innermost
    frame outside site-packages and the standard library, in samples that are not waiting), and
    ``producer_processes``, the tree's busiest other processes (``PID 812 python 0.9 cores``);
    each only when there is one."""
    out: dict[str, str] = {}
    frames: Counter[str] = Counter()
    for samples in _producer_threads(window, main_pid).values():
        for s in samples:
            if _waiting(s.frames):
                continue
            top = stacks.top_frame(s.frames)
            if top is not None:
                frames[f"{top.name} ({top.filename.rsplit('/', 1)[-1]}:{top.line})"] += s.count
    if frames:
        out["producer_frame"] = frames.most_common(1)[0][0]
    busy = _process_busy(window, main_pid) or {}
    names = {p.pid: p.name for p in window.processes}
    top_pids = sorted((pid for pid, b in busy.items() if b >= BUSY_SHARE), key=lambda pid: -busy[pid])[:3]
    if top_pids:
        out["producer_processes"] = ", ".join(
            f"PID {pid} {names.get(pid, '?')} {busy[pid]:.1f} cores" for pid in top_pids
        )
    return out
