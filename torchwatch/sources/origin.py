"""Who a training belongs to, from what the kernel says of it: its real uid and its container.

What a training's environment says (``TORCHWATCH_JOB``, ``RANK``, ``HOSTNAME``) is the training's
own to set; the uid in ``/proc/PID/status`` and the cgroup in ``/proc/PID/cgroup`` are not (a
process cannot move itself into another user's or another pod's cgroup). The exporter labels every
series with these (``uid``, ``container_id``, ``pod_uid``), so a training cannot pass its series off
as another user's.

The container and the pod are read from the cgroup path, the way cAdvisor and the kubelet name
them: the container id is the last 64-hex-digit name in the path (docker, containerd, CRI-O,
podman: ``docker-<id>.scope``, ``cri-containerd-<id>.scope``, ``crio-<id>.scope``, ``libpod-<id>``,
``/docker/<id>``); the pod's UID follows ``pod`` in a kubepods path (the systemd driver writes
its dashes as underscores: ``kubepods-burstable-pod1b4c..._9f2e.slice``). Outside a container
both are empty.
"""

from __future__ import annotations

import re

from torchwatch.model.origin import Origin

__all__ = ["Origin", "origin_of", "parse_cgroup"]

_CONTAINER = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")
_POD = re.compile(r"kubepods.*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
MAX_CGROUP_BYTES = 64 * 1024  # a process's cgroup file is a few hundred bytes
SHORT_ID = 12  # container ids as docker and crictl show them (Origin.container_id)


def parse_cgroup(text: str) -> tuple[str, str]:
    """``(container id, pod UID)`` of the contents of ``/proc/PID/cgroup`` (v1 or v2).

    The v2 line (``0::PATH``) is read first, then every v1 line (a hybrid host's v2 line can be a
    bare ``0::/`` while its v1 hierarchies name the container); in the first path that names
    either, the last container id and the last pod UID win (a nested cgroup names the innermost).

    Returns:
        The container id shortened to :data:`SHORT_ID` hex digits and the pod UID with dashes;
        ``""`` for either not found.
    """
    lines = [ln for ln in text.splitlines() if ln.count(":") >= 2]
    v2 = [ln for ln in lines if ln.startswith("0::")]
    container = pod = ""
    for line in v2 + [ln for ln in lines if not ln.startswith("0::")]:
        path = line.split(":", 2)[2]
        ids = _CONTAINER.findall(path)
        pods = _POD.findall(path)
        if ids:
            container = ids[-1][:SHORT_ID]
        if pods:
            pod = pods[-1].replace("_", "-")
        if container or pod:
            break
    return container, pod


def origin_of(pid: int) -> Origin:
    """The :class:`Origin` of ``pid`` from ``/proc/PID/status`` and ``/proc/PID/cgroup``; what cannot be
    read is left unknown (``None`` / ``""``). Never raises.

    Read it once, when the process is first watched: a PID reused later names another process.
    """
    uid: int | None = None
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for raw in f.read(MAX_CGROUP_BYTES).split(b"\n"):
                if raw.startswith(b"Uid:"):
                    uid = int(raw.split()[1])
                    break
    except (OSError, ValueError, IndexError):
        uid = None
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            text = f.read(MAX_CGROUP_BYTES).decode("utf-8", "replace")
    except OSError:
        text = ""
    container, pod = parse_cgroup(text)
    return Origin(uid, container, pod)
