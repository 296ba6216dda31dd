"""Reading what the tree's would-be DataLoader workers do: the role probe.

A child of a training process whose command line makes it a DataLoader worker (a fork, a
``multiprocessing`` spawn) may be a trainer instead: Hogwild-style training starts its trainers
with ``multiprocessing`` and the main process only joins them. Counted as workers, 2 such trainers
read "2 DataLoader workers take 100 % of the training's CPU" and dataloader-bound at 0.95
(issue 47). The probe dumps each such child's Python stacks once (``py-spy dump --nonblocking``:
the process is not paused) and hands what they show to the tree
(:meth:`~torchwatch.sources.proc.ProcessTree.decide`): torch's worker loop makes it a worker, a
forward, backward or optimizer step a trainer (:func:`torchwatch.analysis.roles.classify`). A
child that shows neither yet (a spawned trainer imports torch for seconds, 80 s with 4 at once on
this loaded 2-core machine) is asked again every :data:`PROBE_EVERY_S` for :data:`GIVE_UP_S`;
after that its command line decides (worker), as after :data:`DUMP_ATTEMPTS` dumps py-spy could not read.

Cost: one dump per child, 0.01-0.03 s of py-spy per process on the 2-core test machine (see
:func:`~torchwatch.sources.pyspy.dump_threads`), at most :data:`DUMPS_PER_ROUND` per round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from torchwatch.analysis.roles import classify
from torchwatch.model.hang import DumpedThread
from torchwatch.sources.proc import ProcessTree
from torchwatch.sources.pyspy import dump_threads

log = logging.getLogger(__name__)

PROBE_EVERY_S = 2.0
"""Seconds between two rounds (and two dumps of one undecided child)."""
GIVE_UP_S = 180.0
"""Seconds after its first dump that an undecided child is left to its command line."""
DUMPS_PER_ROUND = 8
"""Dumps at most per round (8 ranks of 8 workers are decided within 16 s)."""
DUMP_TIMEOUT_S = 3.0
DUMP_ATTEMPTS = 3
"""Dumps of one child that fail (py-spy reads nothing) before its command line decides. One is not
enough: ``py-spy dump --nonblocking`` of a spawned trainer still importing torch failed once in ~8
runs of tests/scenarios/hogwild_spawn.py ("Failed to get stack traces") and read it the next time;
left to its command line, that trainer was a DataLoader worker for the whole run (dataloader-bound
at 0.63 instead of cpu-bound). A child py-spy can never read costs 3 dumps, 0.01-0.03 s each."""

Dumper = Callable[[int], tuple[tuple[DumpedThread, ...], str | None, float]]


def _dump(pid: int) -> tuple[tuple[DumpedThread, ...], str | None, float]:
    return dump_threads(pid, timeout=DUMP_TIMEOUT_S, nonblocking=True)


class RoleProbe:
    """Decides, from their stacks, what the tree's would-be workers do (see the module docstring).

    Args:
        tree: the watched tree; decisions go to it.
        dump: dumps one PID (default: ``py-spy dump --nonblocking``), ``(threads, error, seconds)``.
        clock: monotonic seconds.
    """

    def __init__(self, tree: ProcessTree, dump: Dumper | None = None, clock: Callable[[], float] = time.monotonic):
        self.tree = tree
        self._dump = dump or _dump
        self._clock = clock
        self._first: dict[tuple[int, float], float] = {}  # (pid, create time) -> first dump
        self._last: dict[tuple[int, float], float] = {}
        self._failed: dict[tuple[int, float], int] = {}  # (pid, create time) -> dumps that failed
        self.dumps = 0
        self.cpu_s = 0.0  # the probe thread's own CPU s (its py-spy dumps' CPU is theirs)
        self._thread: threading.Thread | None = None

    def round(self) -> int:
        """Dump the undecided children that are due; returns how many were decided. Never raises."""
        now = self._clock()
        decided = 0
        budget = DUMPS_PER_ROUND
        for node in self.tree.undecided():
            key = (node.pid, node.create_time)
            first = self._first.get(key)
            if first is not None and (now - first > GIVE_UP_S or now - self._last.get(key, 0.0) < PROBE_EVERY_S):
                continue
            if budget <= 0:
                break
            budget -= 1
            self._first.setdefault(key, now)
            self._last[key] = now
            try:
                threads, error, _took = self._dump(node.pid)
            except Exception:  # a dumper must not stop the probe
                log.warning("dumping PID %d for its role failed", node.pid, exc_info=True)
                continue
            self.dumps += 1
            if error is not None and not threads:
                # py-spy could not read it: a passing failure (a non-blocking read of a process that
                # is importing), or for good (no permission, gone, not Python): asked again, then
                # after DUMP_ATTEMPTS failures its command line decides
                failed = self._failed[key] = self._failed.get(key, 0) + 1
                log.debug("role of PID %d: py-spy could not dump it (%s), attempt %d", node.pid, error, failed)
                if failed >= DUMP_ATTEMPTS:
                    self._first[key] = now - GIVE_UP_S - 1.0
                continue
            role = classify(threads)
            log.debug("role of PID %d: %s (%d threads dumped)", node.pid, role or "not yet", len(threads))
            if role is not None:
                self.tree.decide(node.pid, node.create_time, role)
                decided += 1
        alive = {(n.pid, n.create_time) for n in self.tree.nodes().values()}
        for key in [k for k in self._first if k not in alive]:
            self._first.pop(key, None)
            self._last.pop(key, None)
            self._failed.pop(key, None)
        return decided

    def start(self, stop: threading.Event) -> None:
        """Run :meth:`round` every :data:`PROBE_EVERY_S` on a daemon thread until ``stop`` is set."""

        def loop() -> None:
            while not stop.wait(PROBE_EVERY_S):
                since = time.thread_time()
                try:
                    if self.round():
                        self.tree.refresh()
                except Exception:
                    log.exception("the role probe failed; it stops")
                    return
                finally:
                    self.cpu_s += time.thread_time() - since

        self._thread = threading.Thread(target=loop, name="torchwatch-roles", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the thread after ``stop`` was set."""
        if self._thread is not None:
            self._thread.join(timeout)
