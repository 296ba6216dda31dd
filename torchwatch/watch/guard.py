"""The guard: the parent of a training that ``torchwatch run`` started, so that it never outlives torchwatch.

torchwatch starts this file as a script (``python -I -S guard.py CTL STATUS [--new-group] -- COMMAND...``: the
standard library only, no ``site``, no ``PYTHONPATH``, so neither the hook nor a user's
``sitecustomize`` runs here) and the guard starts COMMAND. It is a *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``, prctl(2)): a process of the training whose parent dies
(a DataLoader worker whose main process was killed, a daemonized helper) is re-parented to the
guard, not to init, so the guard always knows the whole tree.

Two pipes join it to torchwatch:

- status (guard → torchwatch), one line each: ``pid N`` once COMMAND runs, ``exit RC`` when it ends
  (``RC`` as :attr:`subprocess.Popen.returncode`: negative for a signal), or ``error ERRNO TEXT``
  when it cannot start;
- control (torchwatch → guard): ``D`` (done: torchwatch saw the end and cleaned up) or ``L``
  (leave the training running) end the guard quietly. End of file without either means torchwatch
  died without cleaning up (SIGKILL, a crash): the guard then SIGKILLs every process below it and
  exits, within milliseconds. ``PR_SET_PDEATHSIG`` in the training alone would not do: it is reset
  in the training's own children (the DataLoader workers, which PyTorch's watchdog only stops after
  up to 5 s), cleared by a set-user-ID exec, and it would also fire when torchwatch exits normally
  after the user chose to leave the training running.

Signals: the guard ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT through Python handlers that do
nothing, so a Ctrl-C or a hang-up meant for the training and torchwatch does not end the guard
before torchwatch has stopped the training; a handler (unlike ``SIG_IGN``) is reset by ``exec``,
so COMMAND starts with the dispositions torchwatch itself was given.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
DONE, LEAVE = b"D", b"L"


def _subreaper() -> None:
    """Become the child subreaper of everything below (Linux ≥ 3.4); without it orphans go to init."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _ignore(signum: int, frame: object) -> None:
    """A handler that does nothing: the signal is meant for the training and torchwatch."""


def descendants(root: int) -> list[int]:
    """PIDs below ``root`` (children, grandchildren, ...), read from ``/proc/*/stat``.

    Returns:
        The PIDs, parents before their children; ``[]`` when ``/proc`` cannot be read.
    """
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            # the command name may hold spaces and parentheses: fields follow the last ')'
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def _reap() -> list[tuple[int, int]]:
    """Collect every exited child (the training, and orphans re-parented here): ``[(pid, status)]``."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def kill_all(rounds: int = 100) -> None:
    """SIGKILL every process below the guard until none is left (a dying process may still fork)."""
    me = os.getpid()
    for _ in range(rounds):
        pids = descendants(me)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
        _reap()


def _say(fd: int, line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, (line + "\n").encode())


def guard(ctl: int, status: int, command: list[str], new_group: bool = False) -> int:
    """Start ``command``, report its PID and exit status on ``status``, obey ``ctl``.

    Args:
        new_group: start ``command`` in a process group of its own (setpgid(2)), so that a
            signal sent to torchwatch's group reaches it only through torchwatch, once.

    Returns:
        The guard's own exit status: 0, or 1 when ``command`` could not be started.
    """
    for sig in HELD_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _ignore)
    _subreaper()
    try:
        # the guard is single-threaded, so a preexec_fn is safe here
        child = subprocess.Popen(command, preexec_fn=os.setpgrp if new_group else None)
    except OSError as exc:
        _say(status, f"error {exc.errno or 0} {exc.strerror or exc}")
        return 1
    _say(status, f"pid {child.pid}")
    try:
        pidfd: int | None = os.pidfd_open(child.pid)
    except (OSError, AttributeError):
        pidfd = None  # Linux < 5.3: poll the exit below instead
    running = True
    while True:
        ready, _, _ = select.select([ctl] + ([pidfd] if pidfd is not None and running else []), [], [], 0.5)
        for pid, wait_status in _reap():
            if pid == child.pid and running:
                running = False
                _say(
                    status,
                    f"exit {-os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)}",
                )
        if ctl in ready:
            try:
                data = os.read(ctl, 64)
            except OSError:
                data = b""
            if DONE in data or LEAVE in data:
                return 0
            if not data:  # torchwatch is gone and did not clean up
                kill_all()
                return 0


def main(argv: list[str]) -> int:
    """``guard.py CTL_FD STATUS_FD [--new-group] -- COMMAND [ARGS...]``."""
    new_group = len(argv) > 2 and argv[2] == "--new-group"
    rest = argv[3:] if new_group else argv[2:]
    if len(argv) < 4 or not rest or rest[0] != "--" or len(rest) < 2:
        print("usage: guard.py CTL_FD STATUS_FD [--new-group] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    return guard(int(argv[0]), int(argv[1]), rest[1:], new_group)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
