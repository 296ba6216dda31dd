"""A process seen across PID namespaces and containers: its IDs on both sides, and who it is.

A training in a container (``docker run``, a Kubernetes pod, ``unshare --pid``) has its own PID
namespace: inside it the main process is PID 1 and its threads have small IDs, and what it
reports about itself (py-spy's thread IDs, ``os.getpid()`` in the hook's records, the PIDs of
the ranks it spawned) are those inner IDs. torchwatch works with the IDs of its own namespace
(the *host* PIDs when it runs on the node), so every inner ID is translated here, from the
kernel's own record of both: ``NSpid:`` in ``/proc/PID/task/TID/status`` lists a thread's ID in
each PID namespace it is in, outermost (ours, when we see it at all) first, innermost last
(proc(5)). An ID that cannot be translated is never taken for a host ID.

Which container a process is in (its container ID and pod UID, from its cgroup path) is read by
:mod:`torchwatch.sources.origin`, for the exporter's labels.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["host_pids", "inner_pid", "ns_ids", "same_namespace", "thread_map"]


def ns_ids(pid: int, tid: int | None = None, proc: str = "/proc") -> tuple[int, ...]:
    """``NSpid`` of process ``pid`` (or of its thread ``tid``): the ID in each PID namespace,
    torchwatch's first, the process's own last; ``()`` when it cannot be read (gone, no
    permission, a kernel before 4.1 without the field)."""
    path = f"{proc}/{pid}/status" if tid is None else f"{proc}/{pid}/task/{tid}/status"
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 16)
    except OSError:
        return ()
    at = text.find(b"\nNSpid:")
    if at < 0:
        return ()
    end = text.find(b"\n", at + 1)
    try:
        return tuple(int(v) for v in text[at + 7 : end if end > 0 else None].split())
    except ValueError:
        return ()


def inner_pid(pid: int, proc: str = "/proc") -> int | None:
    """The PID process ``pid`` has in its own PID namespace (``os.getpid()`` inside it); ``None``
    when unreadable. Equal to ``pid`` when it shares torchwatch's namespace."""
    ids = ns_ids(pid, proc=proc)
    return ids[-1] if ids else None


def thread_map(pid: int, proc: str = "/proc") -> dict[int, int]:
    """``{thread ID inside the process's own PID namespace: thread ID in torchwatch's}`` for
    every thread of process ``pid`` now (one ``status`` read per thread); ``{}`` when the
    process cannot be read. Threads that exit before they are read are left out: a sample of
    an inner ID missing here names no thread torchwatch knows."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return {}
    out: dict[int, int] = {}
    for name in tids:
        if not name.isdigit():
            continue
        ids = ns_ids(pid, int(name), proc)
        if ids:
            out[ids[-1]] = int(name)
    return out


def host_pids(parent: int, inner: Iterable[int], proc: str = "/proc") -> dict[int, int]:
    """``{PID as process parent names it: PID in torchwatch's namespace}`` for those of ``inner``
    that are children of ``parent`` now (e.g. the ranks its hook says it spawned).

    A child's ``NSpid`` has one entry per namespace from ours inward; the one at the depth of
    ``parent``'s own namespace is the name ``parent`` knows it by. PIDs of ``inner`` that are
    not its children (exited, reused, or never were) are left out.
    """
    own = ns_ids(parent, proc=proc)
    wanted = set(inner)
    if not own or not wanted:
        return {}
    depth = len(own) - 1
    children: list[int] = []
    try:
        tasks = os.listdir(f"{proc}/{parent}/task")
    except OSError:
        tasks = []
    for tid in tasks:  # each thread lists the children it forked (proc(5): /proc/PID/task/TID/children)
        try:
            with open(f"{proc}/{parent}/task/{tid}/children") as f:
                children.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    out: dict[int, int] = {}
    for child in children:
        ids = ns_ids(child, proc=proc)
        if len(ids) > depth and ids[depth] in wanted:
            out[ids[depth]] = child
    return out


def same_namespace(pid: int, kind: str = "pid", proc: str = "/proc") -> bool | None:
    """Whether ``pid`` is in torchwatch's own namespace of ``kind`` (``pid``, ``mnt``, ``user``,
    ``net``, ``cgroup``: namespaces(7), compared by inode); ``None`` when it cannot be told."""
    try:
        return os.stat(f"{proc}/{pid}/ns/{kind}").st_ino == os.stat(f"{proc}/self/ns/{kind}").st_ino
    except OSError:
        return None
