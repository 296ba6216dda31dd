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
  ``import torch`` loads: mapping a file merely named ``libtorch.so`` is not enough;
- and those are a torch installation's files, as seen in the process's own mount namespace
  (``/proc/PID/root``): each path still names the very file mapped (the inode in the maps line),
  the binding is an ELF shared object of at least :data:`MIN_BINDING_BYTES` (torch 2.x's is
  20-40 MiB), and the extension's directory holds torch's ``__init__.py``. Two small files named
  like torch's, mapped executable from a directory of one's own, are not a training (issue 49).

That is harder to fake than a file name, not impossible: a user who copies a real torch
installation's files (or builds a look-alike tree with ELF headers) and maps them, or who starts a
real Python that imports torch, is counted; it costs them what installing torch costs. What bounds
what a user can make ``serve`` spend (a session and a py-spy per training) is the cap on trainings
per user and in all (:mod:`torchwatch.watch.fleet`).
torchwatch itself and its ancestors are left out (its descendants are py-spy, never Python). A
test runner or notebook that imported torch counts as the training of everything below it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable

import psutil

__all__ = ["MIN_BINDING_BYTES", "TORCH_BINDING", "TORCH_EXTENSION", "find_trainings", "loads_torch"]

TORCH_BINDING = b"/libtorch_python.so"  # torch's C++ <-> Python binding: loaded by import torch only
TORCH_EXTENSION = re.compile(rb"/torch/_C(?:\.[^/]*)?\.so$")  # torch._C (torch/_C.cpython-312-x86_64-linux-gnu.so)
_PYTHON = re.compile(r"python[0-9.]*$")
_MAPS_CHUNK = 1 << 16
MAX_MAPS_BYTES = 64 << 20  # a maps file is a few MiB even for a large training; stop reading there
# torch's binding is 20-40 MiB in every 2.x wheel (30 MiB in 2.13's CPU wheel); 1 MiB is far below
# any build and far above a file made to carry the name.
MIN_BINDING_BYTES = 1 << 20
_ELF = b"\x7fELF"


def _torch_code(line: bytes) -> tuple[bool, bool]:
    """``(binding, extension)``: whether one ``/proc/PID/maps`` line maps torch's binding or its
    extension module as code (``r-xp``)."""
    parts = line.split(None, 5)
    if len(parts) < 6 or b"x" not in parts[1]:
        return False, False
    path = parts[5].rstrip()
    return path.endswith(TORCH_BINDING), TORCH_EXTENSION.search(path) is not None


def _mapped(line: bytes) -> tuple[int, bytes]:
    """``(inode, path)`` of one maps line."""
    parts = line.split(None, 5)
    return int(parts[4]), parts[5].rstrip()


def _same_file(pid: int, inode: int, path: bytes, min_bytes: int = 0) -> bool:
    """Whether ``path``, in ``pid``'s mount namespace, is a regular file with inode ``inode`` (the
    file mapped) of at least ``min_bytes`` bytes."""
    try:
        st = os.stat(b"/proc/%d/root" % pid + path, follow_symlinks=False)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(st.st_mode) and st.st_ino == inode and st.st_size >= min_bytes


def _real_torch(pid: int, binding: tuple[int, bytes], extension: tuple[int, bytes]) -> bool:
    """Whether the mapped binding and extension are a torch installation's (module docstring)."""
    if not (_same_file(pid, *binding, MIN_BINDING_BYTES) and _same_file(pid, *extension)):
        return False
    try:
        fd = os.open(b"/proc/%d/root" % pid + binding[1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if os.read(fd, 4) != _ELF:
            return False
    except OSError:
        return False
    finally:
        os.close(fd)
    init = os.path.dirname(extension[1]) + b"/__init__.py"
    try:
        st = os.stat(b"/proc/%d/root" % pid + init, follow_symlinks=False)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(st.st_mode)


def _note(
    line: bytes, binding: tuple[int, bytes] | None, extension: tuple[int, bytes] | None
) -> tuple[tuple[int, bytes] | None, tuple[int, bytes] | None]:
    """The first binding and extension mapped as code, with ``line`` looked at (raises ValueError
    on a malformed inode)."""
    if b"/torch" in line or b"libtorch_python" in line:
        b, e = _torch_code(line)
        if b and binding is None:
            binding = _mapped(line)
        if e and extension is None:
            extension = _mapped(line)
    return binding, extension


def loads_torch(pid: int) -> bool:
    """Whether process ``pid`` imported torch: ``/proc/PID/maps`` maps both ``libtorch_python.so``
    and ``torch/_C*.so`` as code, and they are a torch installation's files (the module
    docstring); ``False`` when unreadable.

    Reads in chunks and stops once both are found or after :data:`MAX_MAPS_BYTES`.
    """
    try:
        fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    binding: tuple[int, bytes] | None = None
    extension: tuple[int, bytes] | None = None
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
                binding, extension = _note(line, binding, extension)
            if binding is not None and extension is not None:
                break
        binding, extension = _note(tail, binding, extension)
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)
    return binding is not None and extension is not None and _real_torch(pid, binding, extension)


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
