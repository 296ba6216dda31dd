"""The burst signals: SIGUSR1, SIGUSR2 and the real-time signals, nothing that stops, kills or
interrupts a process (:func:`signal_allowed`), named as ``TORCHWATCH_SIGNAL`` takes them
(:func:`parse_signal`)."""

from __future__ import annotations

import re
import signal

from .base import WireError, clean_text

__all__ = ["burst_signals", "parse_signal", "signal_allowed", "signal_name"]


def burst_signals() -> frozenset[int]:
    """The signals a burst may be asked with: SIGUSR1, SIGUSR2, SIGRTMIN..SIGRTMAX.

    Their default action is to terminate, but none of them is sent by a shell, a terminal, a
    service manager or a scheduler to stop or interrupt a process (signal(7)), so taking one
    changes nothing else in the training. SIGTERM, SIGINT, SIGHUP, SIGKILL, SIGSTOP, ... are
    never accepted.
    """
    sigs = {int(signal.SIGUSR1), int(signal.SIGUSR2)}
    lo, hi = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if lo is not None and hi is not None:
        sigs.update(range(int(lo), int(hi) + 1))
    return frozenset(sigs)


def signal_allowed(signum: object) -> bool:
    """Whether ``signum`` (an int) is one of :func:`burst_signals`."""
    return isinstance(signum, int) and not isinstance(signum, bool) and signum in burst_signals()


def signal_name(signum: int) -> str:
    """``SIGUSR2``, ``SIGRTMIN+3``, or the number for anything else."""
    lo = getattr(signal, "SIGRTMIN", None)
    hi = getattr(signal, "SIGRTMAX", None)
    if lo is not None and hi is not None and int(lo) < signum <= int(hi):
        return f"SIGRTMIN+{signum - int(lo)}"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


_RT = re.compile(r"^(?:SIG)?RTM(IN|AX)(?:([+-])(\d{1,3}))?$")


def parse_signal(text: str) -> int:
    """A burst signal from its name (``SIGUSR1``, ``usr2``, ``SIGRTMIN+2``) or number.

    Raises:
        WireError: unknown, or not one of :func:`burst_signals` (the message names those).
    """
    name = text.strip().upper()
    signum: int | None = None
    if name.isdigit() and len(name) <= 3:
        signum = int(name)
    elif m := _RT.match(name):
        base = getattr(signal, "SIGRTMIN" if m.group(1) == "IN" else "SIGRTMAX", None)
        if base is not None:
            off = int(m.group(3) or 0)
            signum = int(base) + (off if m.group(2) != "-" else -off)
    else:
        sig = getattr(signal, name if name.startswith("SIG") else "SIG" + name, None)
        signum = int(sig) if isinstance(sig, int) else None
    if signum is None or not signal_allowed(signum):
        shown = clean_text(text, 40)
        raise WireError(f"TORCHWATCH_SIGNAL={shown!r} is not allowed: use SIGUSR1, SIGUSR2 or SIGRTMIN+N")
    return signum
