"""The in-process hook: measures steps and DataLoader waits from inside the training, and runs
short ``torch.profiler`` bursts on request.

``torchwatch run`` pre-loads it (a ``sitecustomize`` on ``PYTHONPATH``, see ``boot/``); anyone
who starts the training themselves can call :func:`install` at the top of the script, and
``torchwatch attach PID`` then finds it. Standard library only: ``torch`` is patched when the
user's code imports it, never imported by the hook.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

# Python processes that are not the training even though they inherit its environment (one list,
# shared with torchwatch's role assignment).
from ..wire import HELPER_MODULE_PREFIXES, HELPER_SCRIPT_DIRS, LAUNCHER_MODULES, LAUNCHER_SCRIPTS

__all__ = ["install", "should_install"]

# What torchwatch run puts in the environment to pre-load the hook (see torchwatch.watch.lifecycle.hook_env).
_PRELOAD_VARS = ("TORCHWATCH_HOOK", "TORCHWATCH_HOOK_PATH", "TORCHWATCH_BURST_AT")


def should_install(argv: Sequence[str] | None = None, spawn_mark: str | None = None) -> tuple[bool, str]:
    """Whether this process is a training process the hook belongs in.

    Not in multiprocessing children (spawned DataLoader workers, the forkserver, the resource
    tracker) nor in launchers (torchrun, accelerate, deepspeed), whose ranks get it instead.
    Forked DataLoader workers are handled at fork time (``os.register_at_fork``). A spawned child
    is a rank, and gets the hook, when its parent's hook marked it (``torch.multiprocessing.spawn``,
    see :mod:`torchwatch.hook.ranks`).

    Args:
        argv: the interpreter's full command line; default ``sys.orig_argv``.
        spawn_mark: the mark the parent's hook set for the ranks it starts
            (:func:`torchwatch.hook.ranks.take_spawn_mark`); ``None``: not marked.

    Returns:
        ``(yes, reason when not)``.
    """
    args = list(getattr(sys, "orig_argv", sys.argv) if argv is None else argv)
    if "--multiprocessing-fork" in args:
        if spawn_mark is not None:
            return True, ""  # a rank started by torch.multiprocessing.spawn
        return False, "multiprocessing child"
    for i, a in enumerate(args[:-1]):
        if a == "-c" and "multiprocessing" in args[i + 1]:
            return False, "multiprocessing helper (forkserver / resource tracker)"
        if a == "-m" and args[i + 1] in LAUNCHER_MODULES:
            return False, f"launcher ({args[i + 1]})"
        if a == "-m" and args[i + 1].startswith(HELPER_MODULE_PREFIXES):
            return False, f"torch helper process ({args[i + 1]})"
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None and getattr(mp.current_process(), "_inheriting", False):
        return False, "multiprocessing child (spawn)"
    script = next((a for a in args[1:] if not a.startswith("-")), "")
    if os.path.basename(script) in LAUNCHER_SCRIPTS:
        return False, f"launcher ({os.path.basename(script)})"
    if any(d in os.sep + os.path.normpath(script) for d in HELPER_SCRIPT_DIRS):
        return False, f"torch helper process ({os.path.basename(os.path.dirname(script))})"
    return True, ""


def _env_signal() -> tuple[int, str]:
    """The burst signal from ``$TORCHWATCH_SIGNAL`` (SIGUSR2 by default), or ``(0, why)``."""
    from .. import wire

    text = os.environ.get("TORCHWATCH_SIGNAL")
    if not text:
        return int(signal.SIGUSR2), ""
    try:
        return wire.parse_signal(text), ""
    except wire.WireError as exc:
        return 0, f"{exc}: bursts are off"


def _env_burst_at() -> tuple[int, ...]:
    out = []
    for part in os.environ.get("TORCHWATCH_BURST_AT", "")[:4096].split(","):
        part = part.strip()
        if part.isdigit() and len(part) <= 18:
            out.append(int(part))
    return tuple(out[:64])


def _scrub_preload_env() -> None:
    """Keep torchwatch run's pre-loading out of this process's children.

    A child started with ``subprocess`` (a data-prep script, a tokenizer server) is not the
    training: it must not get a hook, nor a burst signal handler that keeps it from dying on
    that signal. Launchers (torchrun) keep the variables: their ranks are the training.
    """
    for var in _PRELOAD_VARS:
        os.environ.pop(var, None)
    path = os.environ.get("PYTHONPATH")
    if path is None:
        return
    boot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")
    kept = [
        p
        for p in path.split(os.pathsep)
        if os.path.abspath(p or os.curdir) != boot and not os.path.normpath(p).endswith(os.path.join("hook", "boot"))
    ]
    if kept:
        os.environ["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        del os.environ["PYTHONPATH"]


def install(
    signum: int | None = None, burst_at: Iterable[int] | None = None, directory: str | os.PathLike[str] | None = None
) -> bool:
    """Install the hook in this process (idempotent). Never raises.

    In a process started by a hooked process's ``torch.multiprocessing.spawn`` (a rank), the
    mark its parent set is taken out of the environment here, whatever happens next.

    Args:
        signum: the signal that asks for a profiler burst; default ``$TORCHWATCH_SIGNAL`` or SIGUSR2.
            Only SIGUSR1, SIGUSR2 and real-time signals are taken (any other turns bursts off,
            with the reason in the hook's errors). If the training already handles it, bursts
            are off too (and the state says so).
        burst_at: optimizer step counts at which to run a burst by itself; default
            ``$TORCHWATCH_BURST_AT`` (comma-separated).
        directory: where to publish; default :func:`torchwatch.wire.files.base_dir`.

    Returns:
        True when the hook is installed (now, or when torch is imported); False in a process it
        does not belong in (DataLoader worker, launcher) or when it could not start.
    """
    try:
        from .. import wire
        from . import ranks, runtime

        mark = ranks.take_spawn_mark()  # first: never passed on to this process's own children
        if runtime.current() is not None or runtime.installed_elsewhere():
            return True  # installed already (by another copy of torchwatch: see runtime.installed_elsewhere)
        ok, _why = should_install(spawn_mark=mark)
        if not ok:
            return False
        steps = _env_burst_at() if burst_at is None else tuple(int(s) for s in burst_at)
        _scrub_preload_env()  # after reading TORCHWATCH_BURST_AT, one of the variables it removes
        base = Path(directory) if directory is not None else wire.base_dir()
        if signum is None:
            sig, why = _env_signal()
        else:
            sig, why = (int(signum), "") if wire.signal_allowed(signum) else (0, f"signal {signum!r} is not allowed")
        runtime.start(sig, steps, base, why, spawned_by=mark)
        return True
    except Exception as exc:  # the training comes first
        sys.stderr.write(f"torchwatch hook: not installed: {exc!r}\n")
        return False
