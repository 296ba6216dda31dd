"""The trainings ``torchwatch serve`` watches: a :class:`Fleet` of sessions, one per training
found, started, capped and dropped as trainings come and go.

Its caps are :data:`MAX_TRAININGS` and :data:`MAX_PER_USER` (:mod:`torchwatch.watch.caps`, where
their reasons are).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psutil

from torchwatch.analysis.rules_engine import Rule
from torchwatch.model.errors import TorchwatchError
from torchwatch.model.observation import Observation
from torchwatch.model.origin import Origin
from torchwatch.model.readings import Role
from torchwatch.model.text import terminal_safe
from torchwatch.sources.hook import HookReader
from torchwatch.sources.origin import origin_of
from torchwatch.sources.proc import ProcessTree
from torchwatch.watch.caps import MAX_PER_USER, MAX_TRAININGS
from torchwatch.watch.session import Session, SessionOptions
from torchwatch.watch.target import check_attachable

__all__ = ["MAX_PER_USER", "MAX_TRAININGS", "Fleet"]


@dataclass
class _Watched:
    started: float  # the process's start time: a reused PID is another training
    session: Session
    since: float
    uid: int | None = None
    origin: Origin = field(default_factory=Origin)  # read when first watched: a PID reused later is another process


class Fleet:
    """The sessions of the trainings found, by PID; thread-safe for the exporter's scrapes.

    At most ``max_trainings`` are watched, at most ``max_per_user`` of one user (the process's
    real uid); new trainings beyond are left out (said once each) until a place frees. When
    there are more new trainings than places, those whose hook published a checked record
    (:class:`~torchwatch.sources.hook.HookReader`: a live hook of that very process) go first,
    then the oldest: a burst of new look-alikes cannot push out a training already watched.

    Args:
        rules: the rules every session diagnoses with.
        window_s: each session's verdict window, s.
        max_trainings: trainings watched at once (:data:`MAX_TRAININGS`).
        max_per_user: trainings of one user watched at once (:data:`MAX_PER_USER`).
        hang_after: seconds without a step that count as a hang (``--hang-after``); ``None``:
            ``max(30 s, 20 x p95 step)`` per process (:mod:`torchwatch.analysis.hang`).
    """

    def __init__(
        self,
        rules: list[Rule],
        window_s: float,
        max_trainings: int = MAX_TRAININGS,
        max_per_user: int = MAX_PER_USER,
        hang_after: float | None = None,
    ) -> None:
        self._rules = rules
        self._window_s = window_s
        self._hang_after = hang_after
        self.max_trainings = max_trainings
        self.max_per_user = max_per_user
        self._lock = threading.Lock()
        self._watched: dict[int, _Watched] = {}
        self._refused: set[tuple[int, float]] = set()
        self._capped: set[tuple[int, float]] = set()  # left out for a cap, said once
        self._waiting: set[tuple[int, float]] = set()  # launchers with no rank yet, said once

    def observations(self) -> list[Observation | None]:
        """The latest Observation of each training watched (``None`` before its first analysis)."""
        with self._lock:
            sessions = [w.session for w in self._watched.values()]
        return [s.latest_observation for s in sessions]

    def origins(self) -> dict[int, Origin]:
        """``{pid: Origin}`` (uid, container, pod) of the trainings watched, as read when each was
        first watched (the exporter's owner labels)."""
        with self._lock:
            return {pid: w.origin for pid, w in self._watched.items()}

    def sessions(self) -> dict[int, Session]:
        """``{pid: session}`` of the trainings watched now."""
        with self._lock:
            return {pid: w.session for pid, w in self._watched.items()}

    def update(self, found: dict[int, float]) -> tuple[list[int], list[int]]:
        """Start watching the trainings ``found`` (``{pid: start time}``) not watched yet, stop
        watching those that ended (or whose PID now names another process).

        Returns:
            ``(started, dropped)`` PIDs.
        """
        with self._lock:
            current = dict(self._watched)
        dropped = [
            pid
            for pid, w in current.items()
            if found.get(pid) != w.started or w.session.target_gone or not _alive(pid, w.started)
        ]
        for pid in dropped:
            self._drop(pid)
        with self._lock:
            kept = list(self._watched.values())
        per_user = Counter(w.uid for w in kept)
        total = len(kept)
        # the instance watched (or dropped: ended) stays as it is; a reused PID is a new training
        new = [
            (pid, when)
            for pid, when in found.items()
            if not ((pid in current and current[pid].started == when) or (pid, when) in self._refused)
        ]
        if len(new) > 1:
            hooked = {pid: _hooked(pid) for pid, _ in new}
            new.sort(key=lambda item: (not hooked[item[0]], item[1], item[0]))
        self._capped &= set(new)  # a training gone or watched may be said again later
        self._waiting &= set(new)
        started = []
        for pid, when in new:
            uid = _uid(pid)
            if total >= self.max_trainings:
                self._left_out(pid, when, f"{total} trainings watched already (--max-trainings {self.max_trainings})")
                continue
            if per_user[uid] >= self.max_per_user:
                self._left_out(
                    pid,
                    when,
                    f"{per_user[uid]} trainings of uid {uid} watched already (--max-per-user {self.max_per_user})",
                )
                continue
            session = self._start(pid, when, uid)
            if session is not None:
                started.append(pid)
                total += 1
                per_user[uid] += 1
        return sorted(started), dropped

    def _left_out(self, pid: int, when: float, why: str) -> None:
        """Say once that ``pid`` is not watched for a cap (it is looked at again every scan)."""
        if (pid, when) not in self._capped:
            self._capped.add((pid, when))
            print(f"torchwatch serve: not watching PID {pid} for now: {why}", file=sys.stderr)

    def _start(self, pid: int, when: float, uid: int | None = None) -> Session | None:
        try:
            check_attachable(pid)
            session = Session(pid, self._rules, SessionOptions(window_s=self._window_s, hang_after=self._hang_after))
        except (TorchwatchError, psutil.Error) as exc:
            if _launcher_without_ranks(pid):
                # A torchrun agent in its rendezvous (minutes, on a job of many nodes) has started
                # no rank yet: looked at again every scan, not refused for good.
                if (pid, when) not in self._waiting:
                    self._waiting.add((pid, when))
                    print(
                        f"torchwatch serve: PID {pid} is a launcher with no rank yet; watching it once it has one",
                        file=sys.stderr,
                    )
                return None
            self._refused.add((pid, when))
            reason = exc.one_line() if isinstance(exc, TorchwatchError) else repr(exc)
            print(f"torchwatch serve: not watching PID {pid}: {reason}", file=sys.stderr)
            return None
        origin = origin_of(pid)
        session.start()
        with self._lock:
            self._watched[pid] = _Watched(when, session, time.monotonic(), uid, origin)
        cmd = " ".join(session.observe().target.cmdline)[:200]  # escaped by the Observation
        print(terminal_safe(f"torchwatch serve: watching PID {pid}: {cmd}"), file=sys.stderr)
        return session

    def _drop(self, pid: int, why: str = "ended") -> None:
        with self._lock:
            w = self._watched.pop(pid, None)
        if w is None:
            return
        w.session.stop()
        print(f"torchwatch serve: PID {pid} {why}; no longer watched", file=sys.stderr)

    def stop(self) -> None:
        """Stop every session (the trainings go on)."""
        with self._lock:
            pids = list(self._watched)
        for pid in pids:
            self._drop(pid, "left running")


def _uid(pid: int) -> int | None:
    """The real uid of ``pid`` (``None`` when it cannot be read)."""
    try:
        return int(psutil.Process(pid).uids().real)
    except psutil.Error:
        return None


def _hooked(pid: int) -> bool:
    """Whether ``pid``'s hook published a record that passes every check (its very process
    instance, its user's private directory): the best evidence of a training there is."""
    try:
        return HookReader(pid).record() is not None
    except Exception:  # a reader that fails says nothing either way
        return False


def _launcher_without_ranks(pid: int) -> bool:
    """Whether ``pid`` is a launcher (torchrun, accelerate, deepspeed, ...: torchwatch's process
    roles) that has started no training process yet."""
    try:
        tree = ProcessTree(pid)
    except psutil.Error:
        return False
    root = tree.nodes().get(pid)
    return root is not None and root.role is Role.LAUNCHER and not tree.mains()


def _alive(pid: int, started: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
