"""``torchwatch serve``: one long-running watcher per machine, for every training it finds.

Every ``--scan`` seconds it looks for trainings (:func:`torchwatch.watch.discover.find_trainings`:
the topmost Python interpreters that imported torch), starts a watch :class:`Session` on each new
one (from outside: ``/proc``, py-spy, NVML, and the hook's readings where the training carries it;
nothing is injected), at most ``--max-trainings`` of them and ``--max-per-user`` of one user
(:class:`Fleet`), and drops the ones that ended. ``--prometheus`` serves all of them on one
``/metrics``; without it, a status line per training goes to stderr every ``STATUS_EVERY_S``.
SIGINT, SIGTERM or SIGHUP (or ``--duration``) stop every session and the server; torchwatch then
ends by that signal (128+N), as ``run`` and ``attach`` do.

On a fleet, one serve per node and one Prometheus scraping them all: every series carries the
job key the ranks share on every node and the node's name (:func:`node_name`), and the rules
in deploy/prometheus/ compare the ranks of a job across nodes (docs/fleet.md).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from torchwatch.analysis.rules_engine import Rule, load_rules
from torchwatch.cli import MAX_PER_USER, MAX_TRAININGS
from torchwatch.faces.headless import status_line
from torchwatch.faces.prometheus import MetricsServer, ObservationCollector
from torchwatch.faces.webconfig import load_web_config
from torchwatch.model.errors import TorchwatchError, UsageError
from torchwatch.model.observation import Observation
from torchwatch.model.origin import Origin
from torchwatch.model.readings import Role
from torchwatch.model.text import terminal_safe
from torchwatch.sources.hook import HookReader
from torchwatch.sources.origin import origin_of
from torchwatch.sources.proc import ProcessTree
from torchwatch.watch.discover import find_trainings
from torchwatch.watch.lifecycle import StopSignals
from torchwatch.watch.session import Session, SessionOptions
from torchwatch.watch.target import check_attachable

log = logging.getLogger(__name__)

STATUS_EVERY_S = 30.0  # without --prometheus: one status line per training this often


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


NODE_NAME_ENV = "TORCHWATCH_NODE_NAME"


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """The ``host`` label: :data:`NODE_NAME_ENV` when set (in a Kubernetes pod, the node's name
    from the downward API: the pod's own hostname is the pod's name), else this machine's hostname."""
    env = os.environ if environ is None else environ
    return env.get(NODE_NAME_ENV, "").strip()[:253] or socket.gethostname()


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


def serve_command(
    listen: tuple[str, int] | None,
    stops: StopSignals,
    *,
    scan_s: float = 5.0,
    window_s: float = 10.0,
    duration: float | None = None,
    rules_dirs: list[Path] | None = None,
    max_trainings: int = MAX_TRAININGS,
    max_per_user: int = MAX_PER_USER,
    hang_after: float | None = None,
    web_config: Path | None = None,
) -> int:
    """``torchwatch serve``: watch every training found until a stop signal or ``duration``.

    Args:
        listen: ``(host, port)`` of ``--prometheus``, or ``None`` (status lines on stderr).
        stops: the stop signals (installed by the caller).
        scan_s: seconds between two looks for trainings.
        window_s: each session's verdict window, s.
        duration: stop after this many seconds (``None``: until a signal).
        rules_dirs: ``--rules`` directories.
        max_trainings / max_per_user: the caps of :class:`Fleet`.
        hang_after: ``--hang-after`` seconds (``None``: each process's derived threshold).
        web_config: ``--web-config-file`` (TLS and basic auth of the metrics server), or ``None``.

    Returns:
        0 (a stop signal makes the caller end by it).

    Raises:
        TorchwatchError: bad rules, a bad web config (``UsageError``), or the metrics address
            cannot be bound.
    """
    if web_config is not None and listen is None:
        raise UsageError("--web-config-file protects --prometheus", "give --prometheus [HOST:]PORT too")
    web = load_web_config(web_config) if web_config is not None else None
    rules = load_rules(rules_dirs or [])
    fleet = Fleet(rules, window_s, max_trainings, max_per_user, hang_after)
    server = None
    if listen is not None:
        server = MetricsServer(ObservationCollector(fleet.observations, node_name(), fleet.origins), *listen, web=web)
        print(f"torchwatch serve: Prometheus metrics on {server.url}", file=sys.stderr)
    print(
        f"torchwatch serve: looking for PyTorch trainings every {scan_s:g} s (Python interpreters that imported "
        f"torch; at most {max_trainings}, {max_per_user} a user; nothing is injected)",
        file=sys.stderr,
    )
    start = time.monotonic()
    last_status: dict[int, float] = {}
    try:
        while stops.first is None and (duration is None or time.monotonic() - start < duration):
            fleet.update(find_trainings())
            if server is None:
                now = time.monotonic()
                for pid, session in fleet.sessions().items():
                    if now - last_status.get(pid, 0.0) >= STATUS_EVERY_S:
                        obs = session.latest_observation
                        elapsed = obs.elapsed_s if obs is not None else 0.0
                        print(terminal_safe(f"PID {pid}: {status_line(obs, elapsed)}"), file=sys.stderr)
                        last_status[pid] = now
            remaining = scan_s if duration is None else min(scan_s, max(0.0, duration - (time.monotonic() - start)))
            stops.wait(remaining)
    finally:
        fleet.stop()
        if server is not None:
            server.stop()
    print("torchwatch serve: stopped", file=sys.stderr)
    return 0
