"""Which training process a session diagnoses and shows: the focus.

The session asks :class:`FocusPolicy` for the focus once per read of a source that follows it
(py-spy, the hook) and once per analysis tick, and hands the PID to that source or to the rules; no
source asks the session. The policy holds no thread, no clock and no source: the training processes
of the tree and their CPU come in as arguments, the ranks and the straggler of the last analysis
through :meth:`FocusPolicy.judged`, the user's choice through :meth:`FocusPolicy.choose_rank`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from torchwatch.model.observation import RankReading

# A main process becomes the focus when it uses more than this many times the CPU of the current
# focus, plus BUSIER_BY_PCT points of one core: a Python wrapper that starts the real training with
# subprocess is a main too, and an idle one; 2x keeps two alike ranks from trading places on noise.
BUSIER_TIMES = 2.0
BUSIER_BY_PCT = 5.0


class FocusPolicy:
    """Picks the focus among the training processes (the tree's mains), thread-safe.

    In order, the first that is a main of the tree now:

    1. the rank the user chose (the TUI's Ranks panel, :meth:`choose_rank`), by its PID in the last
       analysis; or, when none is chosen, the straggler of the last analysis;
    2. the lowest rank of the last analysis (a ``torch.multiprocessing.spawn`` launcher is a main
       too, and an idle one);
    3. the focus kept from before, until another main uses :data:`BUSIER_TIMES` its CPU plus
       :data:`BUSIER_BY_PCT` points; the oldest main at first. Under torchrun every rank is a main
       and they look alike: the first stays.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: int | None = None
        self._chosen_rank: int | None = None
        self._ranks: tuple[RankReading, ...] = ()
        self._straggler: int | None = None

    @property
    def chosen_rank(self) -> int | None:
        """The rank the user chose to show, ``None``: none chosen."""
        with self._lock:
            return self._chosen_rank

    def choose_rank(self, rank: int | None) -> None:
        """Show ``rank`` from now on; ``None``: the straggler when there is one, else the lowest rank."""
        with self._lock:
            self._chosen_rank = rank

    def judged(self, ranks: Sequence[RankReading], straggler: int | None) -> None:
        """Take the ranks (ordered by rank) and the straggler's PID (``None``: none) of the last
        analysis; with one process, ``()`` and ``None``."""
        with self._lock:
            self._ranks = tuple(ranks)
            self._straggler = straggler

    def focus(self, mains: Sequence[int], cpu_pct: Mapping[int, float]) -> int | None:
        """The PID to diagnose now.

        Args:
            mains: PIDs of the tree's training processes, oldest first.
            cpu_pct: ``{pid: CPU % of one core}`` of the latest process sample (a PID missing: 0).

        Returns:
            A PID of ``mains``, or ``None`` when ``mains`` is empty.
        """
        if not mains:
            return None
        with self._lock:
            if self._chosen_rank is not None:
                picked = next((r.pid for r in self._ranks if r.rank == self._chosen_rank), None)
            else:
                picked = self._straggler
            lowest = self._ranks[0].pid if self._ranks else None
            for pid in (picked, lowest):
                if pid is not None and pid in mains:
                    return pid
            current = self._kept if self._kept is not None and self._kept in mains else mains[0]
            busiest = max(mains, key=lambda pid: cpu_pct.get(pid, 0.0))
            if cpu_pct.get(busiest, 0.0) > BUSIER_TIMES * cpu_pct.get(current, 0.0) + BUSIER_BY_PCT:
                current = busiest
            self._kept = current
            return current
