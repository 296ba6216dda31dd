"""Finding the PyTorch trainings of a machine from outside, for ``torchwatch serve``.

A training is a Python interpreter that imported torch, taken at the top of its tree: a launcher
that imports torch (torchrun) stands for its ranks, a training for its DataLoader workers (they
are below it). The evidence, all read from ``/proc`` (nothing is injected, signalled or written,
so it is safe on other users' processes when run as root; without root only the caller's own
processes can be read and found):

- its executable (``/proc/PID/exe``) is a Python interpreter (``python``, ``python3.12``): not
  its name (``comm``), which any process sets to anything with ``prctl(PR_SET_NAME)``;
- its memory maps hold, as code (an executable mapping, as the dynamic loader makes it), both
  torch's C++ binding ``libtorch_python.so`` and the extension module ``torch/_C*.so`` that
  ``import torch`` loads: mapping a file merely named ``libtorch.so`` is not enough.

That is harder to fake than a file name, not impossible: any user can start a real Python that
imports torch. What bounds what a user can make ``serve`` spend (a session and a py-spy per
training) is the cap on trainings per user and in all (:mod:`torchwatch.cli.serve`).
torchwatch itself and its ancestors are left out (its descendants are py-spy, never Python). A
test runner or notebook that imported torch counts as the training of everything below it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

import psutil

__all__ = ["TORCH_BINDING", "TORCH_EXTENSION", "find_trainings", "loads_torch"]

TORCH_BINDING = b"/libtorch_python.so"  # torch's C++ <-> Python binding: loaded by import torch only
TORCH_EXTENSION = re.compile(rb"/torch/_C(?:\.[^/]*)?\.so$")  # torch._C (torch/_C.cpython-312-x86_64-linux-gnu.so)
_PYTHON = re.compile(r"python[0-9.]*$")
_MAPS_CHUNK = 1 << 16
MAX_MAPS_BYTES = 64 << 20  # a maps file is a few MiB even for a large training; stop reading there


def _torch_code(line: bytes) -> tuple[bool, bool]:
    """``(binding, extension)``: whether one ``/proc/PID/maps`` line maps torch's binding or its
    extension module as code (``r-xp``)."""
    parts = line.split(None, 5)
    if len(parts) < 6 or b"x" not in parts[1]:
        return False, False
    path = parts[5].rstrip()
    return path.endswith(TORCH_BINDING), TORCH_EXTENSION.search(path) is not None


def loads_torch(pid: int) -> bool:
    """Whether process ``pid`` imported torch: ``/proc/PID/maps`` maps both ``libtorch_python.so``
    and ``torch/_C*.so`` as code; ``False`` when unreadable.

    Reads in chunks and stops once both are found or after :data:`MAX_MAPS_BYTES`.
    """
    try:
        fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    binding = extension = False
    tail = b""
    done = 0
    try:
        while done < MAX_MAPS_BYTES:
            chunk = os.read(fd, _MAPS_CHUNK)
            if not chunk:
                break
            done += len(chunk)
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()  # a line cut between two reads
            for line in lines:
                if b"/torch" in line or b"libtorch_python" in line:
                    b, e = _torch_code(line)
                    binding, extension = binding or b, extension or e
            if binding and extension:
                return True
    except OSError:
        return False
    finally:
        os.close(fd)
    b, e = _torch_code(tail)
    return (binding or b) and (extension or e)


def _is_python(proc: psutil.Process) -> bool:
    """The process's executable is a Python interpreter (its ``comm`` name proves nothing)."""
    exe = proc.info.get("exe") or ""  # filled by process_iter
    return bool(_PYTHON.match(os.path.basename(exe)))


def find_trainings(exclude: Iterable[int] = ()) -> dict[int, float]:
    """The trainings running now: ``{pid: start time (s since the epoch)}`` of the topmost
    Python interpreters that imported torch (see the module docstring).

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
