"""The stall / hang recorder of a session: feeds every rank's steps to the step clocks
(:class:`~torchwatch.analysis.hang.HangDetector`), and when one runs out dumps every thread of
every rank and DataLoader worker once, in a thread of its own (py-spy's dumps take a fraction of a
second each; the analysis ticks go on), then keeps the :class:`~torchwatch.model.hang.HangView`.

It never signals, pauses (beyond py-spy's own dump) or stops the training.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from torchwatch.analysis import hang
from torchwatch.analysis.progress import progress_words
from torchwatch.model.hang import DumpedThread, HangView, ProcessDump
from torchwatch.model.readings import HookState, Role
from torchwatch.sources.proc import ProcessTree
from torchwatch.sources.pyspy import dump_threads

log = logging.getLogger(__name__)

Dumper = Callable[[int], tuple[tuple[DumpedThread, ...], str | None, float]]  # see dump_threads


class HangRecorder:
    """Records one hang per stall (see :mod:`torchwatch.analysis.hang` for when).

    Args:
        tree: the watched process tree (its ranks, training processes and DataLoader workers).
        started: when watching started, monotonic s (times in the view count from it).
        hang_after: ``--hang-after`` seconds, ``None`` for ``max(30 s, 20 x p95 step)``.
        dump: dumps one PID (default :func:`torchwatch.sources.pyspy.dump_threads`).
    """

    def __init__(
        self,
        tree: ProcessTree,
        started: float,
        hang_after: float | None = None,
        dump: Dumper | None = None,
    ) -> None:
        self.tree = tree
        self.started = started
        self.detector = hang.HangDetector(hang_after)
        self._dump = dump or dump_threads
        self._ranks: dict[int, int | None] = {}  # pid -> its rank as its hook says
        self._progress: dict[int, str] = {}  # pid -> its epoch and last loss as its hook says
        self._lock = threading.Lock()
        self._view: HangView | None = None
        self._thread: threading.Thread | None = None
        self.recorded = 0  # hangs recorded (one per stall)

    def feed(self, readings: Sequence[object]) -> None:
        """Hook readings: each process's new steps (and its rank)."""
        for r in readings:
            if not isinstance(r, HookState):
                continue
            if r.record is not None and r.record.rank is not None:
                self._ranks[r.pid] = r.record.rank.rank
            if r.record is not None and r.record.progress is not None:
                self._progress[r.pid] = progress_words(r.record.progress)
            with self._lock:
                self.detector.add(r.pid, ((end, duration) for end, duration, _ in r.new_steps))

    def check(self, now: float) -> bool:
        """Fire when a step clock ran out (dumps start in a thread); whether it fired now."""
        alive = set(self.tree.pids())
        with self._lock:
            for pid in [p for p in self.detector.clocks if p not in alive]:
                self.detector.forget(pid)
            fired = self.detector.check(now)
        if fired is None:
            return False
        self.recorded += 1
        rank = self._ranks.get(fired.pid)
        view = HangView(
            state="dumping",
            pid=fired.pid,
            rank=rank,
            threshold_s=round(fired.threshold_s, 2),
            threshold_from=fired.threshold_from,
            last_step_s=round(fired.last_end - self.started, 2),
            fired_s=round(fired.now - self.started, 2),
            detected_after_s=round(fired.now - fired.last_end, 2),
            stalled_s=round(fired.now - fired.last_end, 2),
            number=self.recorded,
            progress=self._progress.get(fired.pid, ""),
        )
        log.warning(
            "no step in PID %s for %.1f s (%s): dumping every thread", fired.pid, view.stalled_s, fired.threshold_from
        )
        with self._lock:
            self._view = view
        self._thread = threading.Thread(target=self._record, args=(view,), name="torchwatch-hang", daemon=True)
        self._thread.start()
        return True

    def _targets(self) -> list[ProcessDump]:
        """Every rank (or the training process) and DataLoader worker, with their roles."""
        nodes = self.tree.nodes()
        mains = [p for p in self.tree.mains() if p in nodes]
        several = sum(1 for p in mains if self._ranks.get(p) is not None) >= 2
        out = []
        for pid in mains:
            rank = self._ranks.get(pid)
            if several and rank is None:
                continue  # a launcher (torch.multiprocessing.spawn's parent) trains nothing
            out.append(ProcessDump(pid, "rank" if rank is not None else "training", rank))
        trainers = {d.pid for d in out}
        for pid, node in sorted(nodes.items()):
            if node.role is Role.WORKER and node.ppid in trainers:
                out.append(ProcessDump(pid, "worker", None, parent=node.ppid))
        return out

    def _record(self, view: HangView) -> None:
        t0 = time.monotonic()
        try:
            dumps = []
            for target in self._targets():
                threads, error, took = self._dump(target.pid)
                dumps.append(replace(target, threads=threads, error=error, dump_s=round(took, 3)))
            rows = tuple(hang.classify(d) for d in dumps)
            odd = hang.odd_one_out(rows)
            summary = hang.summary_line(rows, odd)
        except Exception as exc:  # the recorder must not take the session down
            log.exception("the hang recorder failed")
            rows, odd, summary, dumps = (), None, f"the thread dump failed: {exc!r}", []
        with self._lock:
            current = self._view if self._view is not None else view
            self._view = replace(
                current,
                state="stall" if current.resumed_s is not None else "hang",
                processes=rows,
                odd_one_out=odd,
                summary=summary,
                dump_s=round(time.monotonic() - t0, 3),
                dumps=tuple(dumps),
            )
        log.warning("hang recorded: %s", summary)

    def view(self, now: float) -> HangView | None:
        """The last hang recorded as of ``now`` (monotonic s): still a hang (its stall grows), or
        a stall once the process that fired stepped again; ``None`` when none was recorded."""
        with self._lock:
            v = self._view
            fired, resumed = self.detector.fired, self.detector.resumed_at
            if v is None or fired is None:
                return v
            if resumed is not None and v.resumed_s is None:
                v = self._view = replace(
                    v,
                    state="stall" if v.state != "dumping" else v.state,
                    resumed_s=round(resumed - self.started, 2),
                    stalled_s=round(resumed - fired.last_end, 2),
                )
            elif v.resumed_s is None:
                v = replace(v, stalled_s=round(now - fired.last_end, 2))
            return v

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for dumps in flight (the report waits for them)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
