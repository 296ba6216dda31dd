"""A process seen across PID namespaces and containers: its IDs on both sides, and who it is.

A training in a container (``docker run``, a Kubernetes pod, ``unshare --pid``) has its own PID
namespace: inside it the main process is PID 1 and its threads have small IDs, and what it
reports about itself (py-spy's thread IDs, ``os.getpid()`` in the hook's records, the PIDs of
the ranks it spawned) are those inner IDs. torchwatch works with the IDs of its own namespace
(the *host* PIDs when it runs on the node), so every inner ID is translated here, from the
kernel's own record of both: ``NSpid:`` in ``/proc/PID/task/TID/status`` lists a thread's ID in
each PID namespace it is in, outermost (ours, when we see it at all) first, innermost last
(proc(5)). An ID that cannot be translated is never taken for a host ID.

:func:`identity` reads which container a process is in (the container ID and pod UID from its
cgroup path, the pod's name and namespace from the downward-API environment), for exporters.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "ContainerIdentity",
    "host_pids",
    "identity",
    "inner_pid",
    "ns_ids",
    "parse_cgroup",
    "parse_environ",
    "same_namespace",
    "thread_map",
]


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


@dataclass(frozen=True)
class ContainerIdentity:
    """Which container a process runs in; every field ``""`` when unknown (a process on the host).

    Attributes:
        container_id: the 64-hex ID the runtime gave the container (Docker, containerd, CRI-O,
            podman), from the cgroup path.
        pod_uid: the Kubernetes pod's UID, from the cgroup path (``pod<uid>``, ``_`` in the systemd
            driver's names turned back into ``-``).
        pod_name, pod_namespace: from ``POD_NAME`` / ``POD_NAMESPACE`` in the process's environment
            (the downward API sets them only when the pod spec asks for them; the cgroup path has
            neither).
    """

    container_id: str = ""
    pod_uid: str = ""
    pod_name: str = ""
    pod_namespace: str = ""


_CID = re.compile(r"(?:^|[/\-:])(?:docker-|cri-containerd-|crio-|libpod-)?([0-9a-f]{64})(?:\.scope)?(?=$|/)")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a DNS subdomain (RFC 1123), as the API checks
POD_ENV = ("POD_NAME", "POD_NAMESPACE")


def parse_cgroup(text: str) -> tuple[str, str]:
    """``(container_id, pod_uid)`` from the text of ``/proc/PID/cgroup`` (v1 or v2, cgroupfs or
    systemd names); ``""`` for what it does not hold. The innermost ID of a path wins (a
    container's ID comes after its pod's)."""
    cid = pod = ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for part in reversed(path.split("/")):
            m = _CID.search(part)
            if m and not cid:
                cid = m.group(1)
            p = _POD.search(part)
            if p and not pod:
                pod = p.group(1).replace("_", "-")
        if cid and pod:
            break
    return cid, pod


def parse_environ(raw: bytes) -> dict[str, str]:
    """``POD_NAME`` and ``POD_NAMESPACE`` from a ``/proc/PID/environ`` blob (NUL-separated),
    kept only when they are valid Kubernetes names (the text is the target's: anything else
    is dropped, not escaped)."""
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        name = key.decode(errors="replace")
        if sep and name in POD_ENV:
            text = value.decode(errors="replace")
            if _K8S_NAME.match(text):
                out[name] = text
    return out


def identity(pid: int, proc: str = "/proc", environ: Mapping[str, str] | None = None) -> ContainerIdentity:
    """The container process ``pid`` runs in (see :class:`ContainerIdentity`); never raises
    (an unreadable file leaves its fields empty). ``environ``: the process's environment when
    already read (else ``/proc/PID/environ``, 1 MiB at most)."""
    try:
        with open(f"{proc}/{pid}/cgroup", errors="replace") as f:
            cid, pod = parse_cgroup(f.read(1 << 16))
    except OSError:
        cid = pod = ""
    if environ is None:
        try:
            with open(f"{proc}/{pid}/environ", "rb") as fb:
                env = parse_environ(fb.read(1 << 20))
        except OSError:
            env = {}
    else:
        env = parse_environ(b"\0".join(f"{k}={v}".encode() for k, v in environ.items() if k in POD_ENV))
    return ContainerIdentity(cid, pod, env.get("POD_NAME", ""), env.get("POD_NAMESPACE", ""))
