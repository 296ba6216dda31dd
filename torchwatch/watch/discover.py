"""Finding the PyTorch trainings of a machine from outside, for ``torchwatch serve``.

A training is a Python process that has loaded libtorch (its ``/proc/PID/maps`` names
``libtorch_python``, ``libtorch_cpu`` or ``libtorch.so``), taken at the top of its tree: a launcher
that imports torch (torchrun) stands for its ranks, a training for its DataLoader workers (they
are below it). Nothing is injected, signalled or written: only ``/proc`` is read, so it is safe
on other users' processes when run as root; without root only the caller's own processes can be
read (``/proc/PID/maps`` of another user's process is refused) and only those are found.
torchwatch itself and its ancestors are left out (its descendants are py-spy, never Python). A
test runner or notebook that imported torch counts as the training of everything below it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

import psutil

__all__ = ["TORCH_LIBRARIES", "find_trainings", "loads_torch"]

TORCH_LIBRARIES = (b"/libtorch_python.so", b"/libtorch_cpu.so", b"/libtorch.so")
_PYTHON = re.compile(r"python[0-9.]*$")
# torch names the main thread of a process that imported it (and so the process's comm) pt_main_thread
_PYTHON_NAMES = ("pt_main_thread",)
_MAPS_CHUNK = 1 << 16
MAX_MAPS_BYTES = 64 << 20  # a maps file is a few MiB even for a large training; stop reading there


def loads_torch(pid: int) -> bool:
    """Whether process ``pid`` has libtorch mapped (``/proc/PID/maps``); ``False`` when unreadable.

    Reads in chunks and stops at the first match or after :data:`MAX_MAPS_BYTES`.
    """
    try:
        fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    tail = b""
    done = 0
    try:
        while done < MAX_MAPS_BYTES:
            chunk = os.read(fd, _MAPS_CHUNK)
            if not chunk:
                return False
            text = tail + chunk
            if any(lib in text for lib in TORCH_LIBRARIES):
                return True
            tail = text[-64:]  # a name cut between two reads
            done += len(chunk)
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def _is_python(proc: psutil.Process) -> bool:
    info = proc.info  # filled by process_iter
    exe, name = info.get("exe") or "", info.get("name") or ""
    return bool(_PYTHON.match(os.path.basename(exe)) or _PYTHON.match(name) or name in _PYTHON_NAMES)


def find_trainings(exclude: Iterable[int] = ()) -> dict[int, float]:
    """The trainings running now: ``{pid: start time (s since the epoch)}`` of the topmost
    processes that loaded libtorch (see the module docstring).

    Args:
        exclude: PIDs to leave out with their descendants (besides torchwatch and its ancestors).
    """
    me = os.getpid()
    skip = {me, *exclude}
    try:
        mine = psutil.Process(me)
        skip.update(p.pid for p in mine.parents())
    except psutil.Error:
        pass
    parents: dict[int, int] = {}
    torch: dict[int, float] = {}
    for proc in psutil.process_iter(["pid", "ppid", "exe", "name", "create_time"]):
        pid, ppid = proc.info["pid"], proc.info["ppid"]
        parents[pid] = ppid
        if pid in skip or not _is_python(proc):
            continue
        if loads_torch(pid):
            torch[pid] = float(proc.info["create_time"] or 0.0)
    out = {}
    for pid, started in torch.items():
        # walk up: below another torch process (or one excluded) it is not a training of its own
        node, top = parents.get(pid), True
        seen = 0
        while node and seen < 4096:
            if node in torch or node in exclude:
                top = False
                break
            node, seen = parents.get(node), seen + 1
        if top:
            out[pid] = started
    return out
