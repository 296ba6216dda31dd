"""The process instance a hook directory belongs to (:class:`Instance`): namespace-local PID,
start time (clock ticks since boot, ``/proc/PID/stat`` field 22) and PID-namespace inode, and the
directory name made from them (``<pid>-<start>-<pidns>``), so a later process with the same PID,
or one in another PID namespace, is never taken for it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .base import _U63, PID_MAX, WireError

__all__ = ["Instance", "alive_here", "proc_is_own_namespace", "self_instance", "stat_start"]


_DIR_NAME = re.compile(r"^([1-9][0-9]{0,6})-([0-9]{1,20})-([0-9]{1,20})$")


@dataclass(frozen=True)
class Instance:
    """One process, told apart from any later process with the same PID.

    Attributes:
        pid: its PID in its own PID namespace (what ``os.getpid()`` returns inside it).
        start: its start time, clock ticks since boot (``/proc/PID/stat`` field 22, proc(5)).
        pidns: the inode of its PID namespace (``/proc/PID/ns/pid``, namespaces(7)).
    """

    pid: int
    start: int
    pidns: int

    @property
    def dir_name(self) -> str:
        """The name of its hook directory: ``<pid>-<start>-<pidns>``."""
        return f"{self.pid}-{self.start}-{self.pidns}"

    @classmethod
    def from_dir_name(cls, name: str) -> Instance | None:
        """The instance a hook directory name stands for; ``None`` for any other name."""
        m = _DIR_NAME.match(name)
        if m is None:
            return None
        pid, start, ns = (int(g) for g in m.groups())
        return cls(pid, start, ns) if pid < PID_MAX and start <= _U63 and ns <= _U63 else None


def stat_start(stat: str) -> int:
    """Field 22 (``starttime``) of a ``/proc/PID/stat`` line.

    The command name (field 2) may hold spaces and parentheses, so fields are counted from
    the last ``)``.

    Raises:
        WireError: not a stat line.
    """
    try:
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        raise WireError("/proc/PID/stat: no start time") from None


def self_instance() -> Instance:
    """This process's :class:`Instance`.

    Raises:
        OSError: ``/proc`` is not mounted. WireError: an unreadable stat line.
    """
    with open("/proc/self/stat") as f:
        start = stat_start(f.read())
    return Instance(os.getpid(), start, os.stat("/proc/self/ns/pid").st_ino)


def proc_is_own_namespace() -> bool:
    """Whether ``/proc`` shows this process's PID namespace (``/proc/self`` is our own PID).

    After ``unshare --pid`` without a new ``/proc`` mount, ``/proc/N`` are the PIDs of another
    namespace: nothing there tells whether a PID of ours is alive.
    """
    try:
        return int(os.readlink("/proc/self")) == os.getpid()
    except (OSError, ValueError):
        return False


def alive_here(inst: Instance) -> bool:
    """Whether ``inst`` (an instance of this PID namespace) is still running.

    ``False`` only when provably gone: no ``/proc/PID``, or one with another start time. Call
    only after :func:`proc_is_own_namespace`.
    """
    try:
        with open(f"/proc/{inst.pid}/stat") as f:
            return stat_start(f.read()) == inst.start
    except FileNotFoundError:
        return False
    except ProcessLookupError:
        return False
    except (OSError, WireError):
        return True  # cannot tell: keep it
