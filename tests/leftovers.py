"""Processes the tests started and left running: found, ended and named.

A test that fails (or forgets) may leave a training, a torchwatch or a busy helper running, and
every test after it then runs on a loaded machine (in one CI run a left process spun for 300 s).
``tests/conftest.py`` uses this module so that no process outlives the test that started it:

- the test process becomes a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, prctl(2)): a
  process whose parent dies (the ranks of a killed torchrun, a daemon that forked twice) is
  re-parented to it, not to init, so every process a test starts stays below it;
- after each test, what is below it and was not there before the test (:func:`snapshot`,
  :func:`started_since`), with every process of their process groups and sessions (which may
  have left the tree: :func:`same_group_or_session`), is SIGKILLed (:func:`end`);
- at the end of the session, any process that carries the session's mark in its environment
  (:data:`MARK`, inherited by every process the suite starts unless a test clears the
  environment) and is still alive has escaped both (:func:`marked`).

``python -m tests.leftovers VAR=VALUE`` is the last check of ``.ci/run``: it names, SIGKILLs
and fails on any process still alive, after the suite's end, whose environment holds
``VAR=VALUE``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

MARK = "TESTS_SESSION"
"""The environment variable that marks every process one test session starts (its value is
unique to the session: see :func:`mark_value`)."""

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


@dataclass(frozen=True)
class Left:
    """A process left running: PID, its command line (shortened) and how it was found."""

    pid: int
    command: str
    why: str

    def line(self) -> str:
        """``PID N (why): command``."""
        return f"PID {self.pid} ({self.why}): {self.command}"


Snapshot = frozenset[tuple[int, float]]
"""The processes below the test process at one moment, as ``(pid, start time)`` (a PID alone
may be reused; the start time is ``/proc/PID/stat``'s, in clock ticks since boot)."""


def subreaper() -> bool:
    """Make this process the child subreaper of everything below it (Linux ≥ 3.4). Whether it
    worked (False elsewhere: orphans then go to init, and only the group/session sweep and the
    mark find them)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def mark_value() -> str:
    """A value of :data:`MARK` unique to this session (PID and start time of the test process)."""
    return f"{os.getpid()}-{psutil.Process().create_time():.3f}"


def _children(pid: int) -> list[int]:
    """The children of ``pid``, from ``/proc/PID/task/*/children`` (a read per thread of ``pid``,
    not of every process on the machine: this runs twice per test)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tids:
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/task/{tid}/children") as f:
            kids.extend(int(x) for x in f.read().split())
    return kids


def _started(pid: int) -> float | None:
    """When ``pid`` started (``/proc/PID/stat``'s start time, in clock ticks since boot)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return float(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _tree(root: int) -> dict[int, tuple[float, int]]:
    """Every process below ``root``: PID -> (start time, parent PID). Without
    ``/proc/PID/task/*/children`` (a kernel without CONFIG_PROC_CHILDREN), psutil's walk of
    every process."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        found: dict[int, tuple[float, int]] = {}
        try:
            procs = psutil.Process(root).children(recursive=True)
        except psutil.Error:
            return found
        for p in procs:
            with contextlib.suppress(psutil.Error):
                found[p.pid] = (p.create_time(), p.ppid())
        return found
    found = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid in _children(parent):
            start = _started(pid)
            if start is not None and pid not in found:
                found[pid] = (start, parent)
                todo.append(pid)
    return found


def _below(root: int) -> list[psutil.Process]:
    """The processes below ``root`` now."""
    procs = []
    for pid in _tree(root):
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    return procs


def own_helpers() -> set[int]:
    """PIDs of the helper processes this process's own libraries keep for its whole life
    (multiprocessing's resource tracker and fork server): not a test's to end; they end with
    the test process."""
    pids: set[int] = set()
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        pid = getattr(resource_tracker._resource_tracker, "_pid", None)
        if isinstance(pid, int):
            pids.add(pid)
    with contextlib.suppress(Exception):
        from multiprocessing import forkserver

        pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if isinstance(pid, int):
            pids.add(pid)
    return pids


def snapshot(root: int | None = None) -> Snapshot:
    """The processes below ``root`` (default: this process) now."""
    return frozenset((pid, start) for pid, (start, _) in _tree(os.getpid() if root is None else root).items())


def started_since(before: Snapshot, root: int | None = None) -> list[psutil.Process]:
    """Processes below ``root`` (default: this process) that were not there at ``before``,
    except this process's own helpers (:func:`own_helpers`) and anything below a process that
    was there (a longer-lived fixture's training keeps the workers it starts)."""
    me = os.getpid() if root is None else root
    tree = _tree(me)
    if not tree:
        return []
    older = {pid for pid, _ in before}
    helpers = own_helpers()
    found = []
    for pid, (start, parent) in tree.items():
        if (pid, start) in before or pid in helpers:
            continue
        while parent != me and parent not in older and parent in tree:
            parent = tree[parent][1]
        if parent in older:
            continue  # below a process that was there before the test
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found


def same_group_or_session(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Every process on the machine in the process group or session of one of ``procs``, other
    than this process's own group and session (and init's)."""
    groups: set[int] = set()
    sessions: set[int] = set()
    for p in procs:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(p.pid))
            sessions.add(os.getsid(p.pid))
    mine = {0, 1, os.getpgid(0), os.getsid(0)}
    groups -= mine
    sessions -= mine
    if not groups and not sessions:
        return []
    found = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(pid) in groups or os.getsid(pid) in sessions:
                found.append(psutil.Process(pid))
    return found


def _command(p: psutil.Process) -> str:
    try:
        text = " ".join(p.cmdline()) or p.name()
    except psutil.Error:
        text = "?"
    return text if len(text) <= 160 else text[:157] + "..."


def end(procs: Iterable[psutil.Process], why: str, timeout: float = 10.0) -> list[Left]:
    """SIGKILL ``procs`` (each one still the process it was: PID and start time checked) and
    wait up to ``timeout`` s for them to go, reaping those that are this process's children.
    Returns the ones that were running (zombies, already exited, are reaped, not listed)."""
    left: list[Left] = []
    killed: list[psutil.Process] = []
    seen: set[int] = set()
    for p in procs:
        if p.pid in seen or p.pid == os.getpid():
            continue
        seen.add(p.pid)
        try:
            if not p.is_running():
                continue
            zombie = p.status() == psutil.STATUS_ZOMBIE
            command = _command(p)
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            continue
        killed.append(p)
        if not zombie:
            left.append(Left(p.pid, command, why))
    psutil.wait_procs(killed, timeout=timeout)  # reaps this process's children
    return left


def marked(var: str, value: str, exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Processes alive now whose environment holds ``var=value``, but for ``exclude``, this
    process, its ancestors and its own helpers (environments that cannot be read are skipped:
    another user's, without root)."""
    skip = {os.getpid(), *exclude, *own_helpers()}
    with contextlib.suppress(psutil.Error):
        skip.update(a.pid for a in psutil.Process().parents())
    needle = f"{var}={value}".encode()
    found = []
    for pid in psutil.pids():
        if pid in skip:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (OSError, psutil.Error):
            continue
    return found


def main(argv: list[str]) -> int:
    """``python -m tests.leftovers VAR=VALUE [--grace S]``: exit 1 (naming and SIGKILLing them)
    if processes marked ``VAR=VALUE`` are still alive ``S`` s (default 10) after the call;
    0 if none."""
    if not argv or "=" not in argv[0]:
        print("usage: python -m tests.leftovers VAR=VALUE [--grace S]", file=sys.stderr)
        return 2
    var, value = argv[0].split("=", 1)
    grace = float(argv[2]) if len(argv) > 2 and argv[1] == "--grace" else 10.0
    deadline = time.monotonic() + grace
    while True:  # a process ending with the suite (a helper reading its pipe to EOF) gets the grace time
        alive = marked(var, value)
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    left = end(alive, f"still alive {grace:g} s after the tests ended")
    for item in left:
        print(f"tests left a process running: {item.line()}", file=sys.stderr)
    if left:
        print(f"{len(left)} process(es) of the test suite outlived it (killed now)", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
