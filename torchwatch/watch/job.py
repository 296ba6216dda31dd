"""``attach`` to one rank, or to a launcher, of a distributed job torchwatch did not start: its ranks.

A job on one machine is a launcher and its ranks, the launcher's direct children:

- torchrun's agent (``torchrun``, ``python -m torch.distributed.run`` and the other launchers of
  :mod:`torchwatch.wire.roles`): each child is a rank, and carries ``RANK``, ``LOCAL_RANK`` and
  ``WORLD_SIZE`` in its environment (``/proc/PID/environ``, readable by its user and root);
- a script that called ``torch.multiprocessing.spawn``: its ranks run multiprocessing's spawn entry
  point (``python -c "from multiprocessing.spawn import spawn_main; ..." --multiprocessing-fork``),
  as a spawned DataLoader worker does. What tells them apart is the function the child runs:
  torch's ``_wrap`` (``torch/multiprocessing/spawn.py``) for a rank, the DataLoader's
  ``_worker_loop`` for a worker, read from the child's Python stack with ``py-spy dump
  --nonblocking`` (it reads the process's memory, it does not stop it).

A DataLoader worker of a rank is the launcher's grandchild, never one of its ranks. Every process
is bound to its PID and start time (a PID reused later names another process), and a launcher and
its ranks must share a PID namespace (a PID read inside a container names another process outside).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from torchwatch.model.errors import TorchwatchError
from torchwatch.model.readings import Frame, Role
from torchwatch.sources.proc import ProcessTree, TreeNode
from torchwatch.sources.pyspy import dump_threads
from torchwatch.wire import LAUNCHER_MODULES, LAUNCHER_SCRIPTS, MP_HELPER_MARKERS, SPAWN_MARKERS

SPAWN_WRAP = ("_wrap", os.path.join("torch", "multiprocessing", "spawn.py"))
"""The frame a ``torch.multiprocessing.spawn`` rank runs its function in: (function, file ending)."""
WORKER_LOOP = ("_worker_loop", os.path.join("torch", "utils", "data", "_utils", "worker.py"))
"""The frame a DataLoader worker runs its loop in."""
BOOTSTRAP = ("_bootstrap", os.path.join("multiprocessing", "process.py"))
"""The frame multiprocessing starts a child's target from (once per process started, fork or spawn)."""
DUMP_TIMEOUT_S = 5.0  # py-spy dump of one process: 0.01-0.1 s; a stuck read must not stall attach


@dataclass(frozen=True)
class Member:
    """One rank of the job as found from outside.

    Attributes:
        pid: its PID (in torchwatch's PID namespace).
        started: its start time (s since the epoch, psutil's ``create_time``): with ``pid``, who it is.
        rank: its ``RANK`` from the environment, ``None`` when not there (an ``mp.spawn`` rank learns
            it from ``torch.distributed``, which its hook then publishes).
        how: how it was told to be a rank (one phrase, for the report).
    """

    pid: int
    started: float
    rank: int | None
    how: str

    def alive(self) -> bool:
        """Whether ``pid`` still names this process (same start time)."""
        try:
            return psutil.Process(self.pid).create_time() == self.started
        except psutil.Error:
            return False


@dataclass(frozen=True)
class Job:
    """What ``attach PID`` watches: ``PID`` alone, or the job it is part of.

    Attributes:
        named: the PID the user gave.
        launcher: the launcher's PID when ``named`` is a rank or the launcher of a job, else ``None``.
        kind: ``torchrun`` (any launcher of :data:`~torchwatch.wire.roles.LAUNCHER_MODULES`) or
            ``mp.spawn``; ``None`` for no job.
        ranks: the ranks found, oldest first.
        note: why no job was found or a rank left out, ``""`` when nothing to say.
    """

    named: int
    launcher: int | None = None
    kind: str | None = None
    ranks: tuple[Member, ...] = ()
    note: str = ""

    @property
    def root(self) -> int:
        """The PID whose tree the session watches: the launcher of a job, else ``named``."""
        return self.launcher if self.launcher is not None and self.ranks else self.named

    @property
    def is_job(self) -> bool:
        """Ranks were found (one rank alone under its launcher counts: its job is watched)."""
        return self.launcher is not None and bool(self.ranks)

    def line(self) -> str:
        """One line saying what was found (printed by attach)."""
        if not self.is_job:
            return (
                f"torchwatch: PID {self.named}: no distributed job found ({self.note or 'not a rank nor a launcher'})"
            )
        listed = ", ".join(f"PID {m.pid}" + (f" (rank {m.rank})" if m.rank is not None else "") for m in self.ranks)
        who = "its launcher" if self.named == self.launcher else f"the launcher of PID {self.named}"
        text = f"torchwatch: {len(self.ranks)} ranks found under {self.kind} (PID {self.launcher}, {who}): {listed}"
        return text + (f"; {self.note}" if self.note else "")

    def report(self) -> dict[str, object]:
        """The JSON report's ``injection.job`` value."""
        return {
            "named_pid": self.named,
            "launcher_pid": self.launcher,
            "launcher": self.kind,
            "ranks_found": [{"pid": m.pid, "rank": m.rank, "how": m.how} for m in self.ranks],
            "note": self.note or None,
        }


StackReader = Callable[[int], Sequence[Frame] | None]
"""``pid -> its main thread's Python frames`` (innermost first, as ``py-spy dump`` lists them),
``None`` when they cannot be read."""


def main_frames(pid: int) -> Sequence[Frame] | None:
    """The main thread's Python frames of ``pid`` from ``py-spy dump --nonblocking`` (the process is
    not stopped); ``None`` without py-spy, without permission, or on a timeout (:data:`DUMP_TIMEOUT_S`)."""
    threads, error, _took = dump_threads(pid, timeout=DUMP_TIMEOUT_S, nonblocking=True)
    if error is not None or not threads or threads[0].tid != pid:
        return None
    return threads[0].frames


def _joined(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def launcher_kind(cmdline: str) -> str | None:
    """``torchrun`` when ``cmdline`` (joined) is a launcher of ranks (torchrun, accelerate, deepspeed)."""
    words = cmdline.split()
    if any(f"-m {m}" in cmdline for m in LAUNCHER_MODULES):
        return "torchrun"
    if any(os.path.basename(w) in LAUNCHER_SCRIPTS for w in words[:2]):
        return "torchrun"
    return None


def distinct_trainings(tree: ProcessTree, root: int) -> list[TreeNode]:
    """The trainings under ``root``, each once: a main process stands for itself and for every main
    below it (``mp.spawn`` ranks under their script), and the ranks of one launcher of
    :data:`LAUNCHER_MODULES` / :data:`LAUNCHER_SCRIPTS` (torchrun, accelerate, deepspeed) are that
    launcher's one training. Oldest PID first.

    ``attach 1`` on a host reaches every Python process of every user; unrelated trainings there
    must be told apart, not watched as one that hops from training to training.
    """
    nodes = tree.nodes()
    found: dict[int, TreeNode] = {}
    for pid, node in nodes.items():
        if node.role is not Role.MAIN:
            continue
        key, cur = pid, node
        while cur.pid != root and cur.ppid in nodes:
            cur = nodes[cur.ppid]
            if cur.role is Role.MAIN or launcher_kind(" ".join(cur.cmdline)) is not None:
                key = cur.pid
        found.setdefault(key, nodes[key])
    return sorted(found.values(), key=lambda n: (n.create_time, n.pid))


def several_trainings_error(root: int, trainings: Sequence[TreeNode], shown: int = 5) -> TorchwatchError:
    """The one-line refusal of ``attach ROOT`` when ROOT's tree holds several trainings."""
    listed = ", ".join(f"PID {n.pid} ({' '.join(n.cmdline)[:60] or n.name})" for n in trainings[:shown])
    more = f" and {len(trainings) - shown} more" if len(trainings) > shown else ""
    return TorchwatchError(
        f"PID {root} is not a training and its tree holds {len(trainings)} trainings: {listed}{more}",
        f"attach to one of them (torchwatch attach {trainings[0].pid}), or watch them all with: torchwatch serve",
    )


def _pid_ns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def _env_rank(pid: int) -> tuple[int | None, bool]:
    """``(RANK, whether RANK and WORLD_SIZE are both set)`` from ``/proc/PID/environ`` (capped read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        return None, False
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    rank, world = env.get(b"RANK", b"").strip(), env.get(b"WORLD_SIZE", b"").strip()
    if rank.isdigit() and world.isdigit() and len(rank) < 8:
        return int(rank), True
    return None, False


def _frames(frames: Sequence[Frame], func: str, path: str) -> int:
    """How many of ``frames`` run ``func`` in a file whose path ends with ``path``."""
    return sum(f.name == func and f.filename.endswith(path) for f in frames)


def _is_spawn_rank(pid: int, stacks: StackReader) -> bool | None:
    """Whether a spawned child runs torch's ``_wrap`` (a rank), ``None`` when its stack is unreadable.

    A process forked by a rank (a DataLoader worker with the ``fork`` context) keeps the rank's
    frames below its own, ``_wrap`` included: it runs a second multiprocessing ``_bootstrap``
    (or the DataLoader's ``_worker_loop``), and is no rank.
    """
    text = stacks(pid)
    if text is None:
        return None
    return _frames(text, *SPAWN_WRAP) >= 1 and _frames(text, *WORKER_LOOP) == 0 and _frames(text, *BOOTSTRAP) <= 1


def _ranks_of(launcher: psutil.Process, kind: str, stacks: StackReader) -> tuple[list[Member], list[str]]:
    """The launcher's children that are ranks, and why each other Python child was left out."""
    ns = _pid_ns(launcher.pid)
    found: list[Member] = []
    left: list[str] = []
    try:
        children = launcher.children()
    except psutil.Error:
        return [], []
    for child in children:
        cmd = _joined(child)
        if not cmd or any(m in cmd for m in MP_HELPER_MARKERS):
            continue
        try:
            started = child.create_time()
        except psutil.Error:
            continue
        if ns is None or _pid_ns(child.pid) != ns:
            left.append(f"PID {child.pid} is in another PID namespace")
            continue
        rank, has_env = _env_rank(child.pid)
        if has_env:
            found.append(Member(child.pid, started, rank, "RANK and WORLD_SIZE in its environment"))
        elif kind == "mp.spawn" and any(m in cmd for m in SPAWN_MARKERS):
            if _is_spawn_rank(child.pid, stacks):
                found.append(Member(child.pid, started, None, "runs torch.multiprocessing.spawn's _wrap"))
        elif kind == "torchrun" and "python" in os.path.basename(cmd.split()[0]):
            found.append(Member(child.pid, started, None, "a Python child of the launcher (environment unreadable)"))
    found.sort(key=lambda m: (m.rank if m.rank is not None else 1 << 30, m.started, m.pid))
    return found, left


def find_job(pid: int, stacks: StackReader = main_frames) -> Job:
    """The job ``pid`` is a rank or the launcher of (see the module docstring). Never raises.

    Args:
        pid: the PID given to ``attach``.
        stacks: reads a process's Python stacks (tests pass their own).

    Returns:
        A :class:`Job`; :attr:`Job.is_job` is false when ``pid`` is neither a rank with a
        launcher parent nor a launcher with ranks (then :attr:`Job.note` says why).
    """
    try:
        proc = psutil.Process(pid)
        cmd = _joined(proc)
        parent = proc.parent()
    except psutil.Error:
        return Job(pid, note="the process exited")
    # attach to the launcher itself
    kind = launcher_kind(cmd)
    if kind is None and not any(m in cmd for m in SPAWN_MARKERS):
        kids = [c for c in _children(proc) if any(m in _joined(c) for m in SPAWN_MARKERS)]
        # the oldest spawned child decides (a training with 8 spawned DataLoader workers costs one
        # py-spy dump, not 8); each child is then read on its own
        if kids and _is_spawn_rank(min(kids, key=_created).pid, stacks):
            kind = "mp.spawn"
    if kind is not None:
        return _job(pid, proc, kind, stacks)
    # attach to a rank: its parent is the launcher
    if parent is None or _pid_ns(parent.pid) != _pid_ns(pid):
        return Job(pid, note="its parent is not in its PID namespace")
    parent_cmd = _joined(parent)
    parent_kind = launcher_kind(parent_cmd)
    if parent_kind is None and any(m in cmd for m in SPAWN_MARKERS) and not any(m in parent_cmd for m in SPAWN_MARKERS):
        if _is_spawn_rank(pid, stacks):
            parent_kind = "mp.spawn"
        else:
            return Job(pid, note="a spawned process that does not run torch.multiprocessing.spawn's _wrap")
    if parent_kind is None:
        return Job(pid, note=f"its parent (PID {parent.pid}) is no launcher of ranks")
    job = _job(pid, parent, parent_kind, stacks)
    if not any(m.pid == pid for m in job.ranks):
        return Job(pid, note=f"it is not one of the ranks of its parent (PID {parent.pid})")
    return job


def _created(proc: psutil.Process) -> tuple[float, int]:
    try:
        return proc.create_time(), proc.pid
    except psutil.Error:
        return float("inf"), proc.pid


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children()
    except psutil.Error:
        return []


def _job(named: int, launcher: psutil.Process, kind: str, stacks: StackReader) -> Job:
    ranks, left = _ranks_of(launcher, kind, stacks)
    return Job(named, launcher.pid, kind, tuple(ranks), "; ".join(left))
