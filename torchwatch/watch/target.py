"""Checking the process to watch or the command to start (starting and stopping it: :mod:`torchwatch.watch.lifecycle`).

Every failure here is a :class:`~torchwatch.model.errors.TorchwatchError` with a hint: the CLI
prints one line and exits non-zero, never a traceback.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

import psutil

from torchwatch.model.errors import TorchwatchError, UsageError
from torchwatch.sources.proc import ProcessTree, ancestors


def _describe(proc: psutil.Process) -> str:
    try:
        return f"PID {proc.pid} ({proc.name()})"
    except psutil.Error:
        return f"PID {proc.pid}"


def proc_namespace_error(proc: str = "/proc", own_pid: int | None = None) -> TorchwatchError | None:
    """Why ``proc`` cannot be read for this process's PID namespace, or ``None`` when it can.

    After ``unshare --pid --fork`` without ``--mount-proc`` (a PID namespace whose ``/proc`` is
    still the parent namespace's), ``/proc/N`` is the parent's PID N: psutil, py-spy and the
    launched training's PID then name other processes, or none (``run`` failed with a traceback
    in such a namespace). ``/proc/self`` names this process in ``/proc``'s own namespace: it is
    ``own_pid`` (default :func:`os.getpid`) only when ``/proc`` is this namespace's. A ``/proc``
    that cannot be read is :func:`check_attachable`'s and doctor's ``proc`` check's to report.
    """
    try:
        shown = int(os.readlink(f"{proc}/self"))
    except (OSError, ValueError):
        return None
    mine = os.getpid() if own_pid is None else own_pid
    if shown == mine:
        return None
    return TorchwatchError(
        f"{proc} is another PID namespace's (it shows torchwatch as PID {shown}, its own PID is {mine}): this "
        "PID namespace has no /proc of its own (unshare --pid without --mount-proc), and no PID read there names "
        "the process torchwatch means",
        "give the namespace a /proc of its own, as container runtimes do (unshare --pid --fork --mount-proc), "
        "or run torchwatch outside it with the training's PID there: torchwatch attach PID",
    )


def check_proc_namespace() -> None:
    """Raise :func:`proc_namespace_error`'s error when ``/proc`` is another PID namespace's.

    Raises:
        TorchwatchError: ``/proc`` shows another PID namespace (exit 1, with the fix).
    """
    error = proc_namespace_error()
    if error is not None:
        raise error


def parse_pid(text: str) -> int:
    """A PID given on the command line (``attach``, ``detach``, ``doctor``).

    Raises:
        UsageError: not a positive number (one line, with where to find the PID).
    """
    try:
        pid = int(text)
    except ValueError:
        raise UsageError(f"PID must be a number, not {text!r}", "find it with: pgrep -af python") from None
    if pid <= 0:
        raise UsageError(f"PID must be a positive number, not {pid}", "find it with: pgrep -af python")
    return pid


def check_attachable(pid: int) -> ProcessTree:
    """Check that ``pid`` can be watched and return its tree.

    Raises:
        TorchwatchError: ``/proc`` is another PID namespace's (:func:`check_proc_namespace`),
            no such process, exited, owned by another user (without root),
            or neither it nor a descendant is a Python process (torchwatch's own branch, when
            ``pid`` is its ancestor, does not count).
    """
    if pid <= 0:
        raise UsageError(f"PID must be a positive number, not {pid}", "find it with: pgrep -f train.py")
    check_proc_namespace()
    if pid == os.getpid():
        raise TorchwatchError("torchwatch cannot watch itself", "give the PID of the training process")
    try:
        proc = psutil.Process(pid)
        status = proc.status()
    except psutil.NoSuchProcess:
        raise TorchwatchError(f"no process with PID {pid}", "check the PID with: pgrep -af python") from None
    except psutil.AccessDenied:
        raise TorchwatchError(
            f"permission denied reading PID {pid}", "run torchwatch as the process's user, or with sudo"
        ) from None
    if status == psutil.STATUS_ZOMBIE:
        raise TorchwatchError(f"{_describe(proc)} has already exited", "start the training again and attach then")
    if os.geteuid() != 0:
        try:
            owner = proc.uids().real
        except psutil.Error:
            owner = -1
        if owner != os.getuid():
            try:
                user = proc.username()
            except (psutil.Error, KeyError):
                user = str(owner)
            raise TorchwatchError(
                f"{_describe(proc)} belongs to user {user}: torchwatch may not read its stacks, threads or IO",
                f"run torchwatch as {user}, or with sudo",
            )
    try:
        tree = ProcessTree(pid)
    except psutil.NoSuchProcess:
        raise TorchwatchError(f"{_describe(proc)} exited while attaching", "start it again") from None
    except psutil.AccessDenied:
        raise TorchwatchError(
            f"permission denied reading {_describe(proc)}", "run torchwatch as the process's user, or with sudo"
        ) from None
    if not tree.mains() and pid in ancestors():
        # The shell (or PID 1) torchwatch runs under: torchwatch's own branch is left out of the
        # tree, and nothing else there is Python.
        raise TorchwatchError(
            f"{_describe(proc)} is an ancestor of torchwatch and, torchwatch aside, runs no Python process",
            "give the PID of the training's Python process: pgrep -af python",
        )
    if not tree.mains():
        raise TorchwatchError(
            f"{_describe(proc)} is not a Python process and has no Python child",
            "attach to the training's Python process: pgrep -af python",
        )
    return tree


def check_command(command: Sequence[str]) -> None:
    """Check that ``command`` names a program that exists and is executable.

    Raises:
        UsageError: empty command.
        TorchwatchError: the program is not found or not executable.
    """
    if not command:
        raise UsageError("no command to run", "usage: torchwatch run [OPTIONS] -- python train.py")
    program = command[0]
    if os.sep in program:
        if not os.path.exists(program):
            raise TorchwatchError(f"command not found: {program}", "check the path")
        if not os.access(program, os.X_OK) or os.path.isdir(program):
            raise TorchwatchError(f"not executable: {program}", f"chmod +x {program}, or run it with python")
    elif shutil.which(program) is None:
        raise TorchwatchError(
            f"command not found: {program}", "check the spelling and PATH, e.g. torchwatch run -- python train.py"
        )
