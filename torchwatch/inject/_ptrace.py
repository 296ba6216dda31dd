"""Helper process: load a shared library into a Python process with ptrace, at a safe moment.

Started once by :class:`torchwatch.inject.injector.Injector` as ``python -I _ptrace.py`` and
then asked over its stdin (one JSON request a line, one JSON answer a line; see
:func:`serve`), so the interpreter's start-up (~0.1 s of CPU) is not paid while a training is
held. It imports nothing from torchwatch (``-I`` and a script path: no current directory,
no ``PYTHONPATH`` on its ``sys.path``). A separate process, not a thread of torchwatch,
because the injector holds the calling interpreter's GIL while it waits for the target, and
because the waits for the target's ptrace stops must not meet torchwatch's own ``waitpid``
for the training it launched.

The library is hypno's: a constructor that runs ``PyGILState_Ensure(); PyRun_SimpleString(code);
PyGILState_Release()`` with the code patched into the file. pyinjector (kubo/injector) stops
the target's main thread with ``PTRACE_ATTACH`` and calls ``dlopen`` *on that thread, wherever
it was stopped*. Its README warns that a thread stopped inside ``malloc`` (holding a lock that
``dlopen`` needs) then waits forever, and Python code run while the thread was inside the
interpreter's own allocator could corrupt it. So this helper first looks where the thread
stopped (``/proc/PID/syscall``: the system call it waits in, or the instruction pointer) and
only loads the library when the thread is

- blocked in a waiting system call (futex, poll, read, sleep, ...), where no C-library lock
  is held and the GIL, if it was released, is taken again the normal way; or
- running code in a library other than the C library, the dynamic loader, the C++ runtime,
  an allocator or the Python interpreter (e.g. inside a torch kernel).

pyinjector puts back only the general registers afterwards; this helper also saves and
restores the floating-point and vector registers (:class:`VectorState`), without which a
torch loop computed wrong numbers and crashed within ~100 injections.

Otherwise it detaches (the thread was held for well under a millisecond) and tries again
a few milliseconds later, for up to WINDOW_S seconds. Each look is one ptrace stop of the
main thread only; other threads and DataLoader workers keep running.

Each answer is ``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import re
import sys
import time
from typing import Any

MAGIC = b"--- hypno code start ---"  # hypno's marker for the code slot in its library

# Waiting system calls, by architecture (asm/unistd_64.h; asm-generic/unistd.h for aarch64).
_WAITING_SYSCALLS = {
    "x86_64": {
        0: "read",
        7: "poll",
        23: "select",
        24: "sched_yield",
        34: "pause",
        35: "nanosleep",
        43: "accept",
        45: "recvfrom",
        47: "recvmsg",
        61: "wait4",
        128: "rt_sigtimedwait",
        130: "rt_sigsuspend",
        202: "futex",
        230: "clock_nanosleep",
        232: "epoll_wait",
        247: "waitid",
        270: "pselect6",
        271: "ppoll",
        281: "epoll_pwait",
        288: "accept4",
        441: "epoll_pwait2",
        449: "futex_waitv",
    },
    "aarch64": {
        22: "epoll_pwait",
        63: "read",
        72: "pselect6",
        73: "ppoll",
        95: "waitid",
        98: "futex",
        101: "nanosleep",
        115: "clock_nanosleep",
        124: "sched_yield",
        133: "rt_sigsuspend",
        137: "rt_sigtimedwait",
        202: "accept",
        207: "recvfrom",
        212: "recvmsg",
        242: "accept4",
        260: "wait4",
        441: "epoll_pwait2",
        449: "futex_waitv",
    },
}

# Code where a stopped thread may hold a lock dlopen needs, or be inside the interpreter.
_UNSAFE_LIBS = re.compile(
    r"^(libc[.-]|ld-linux|ld-musl|ld-\d|libpthread|libdl[.-]|libpython\d|python\d|libstdc\+\+|libgcc_s|"
    r"libjemalloc|libtcmalloc|libmimalloc)"
)
_SAFE_SPECIAL = ("[vdso]", "[vsyscall]")


class Maps:
    """The target's memory mappings: which file an address belongs to."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exe = os.path.realpath(f"/proc/{pid}/exe")
        self.ranges: list[tuple[int, int, str]] = []
        self.reload()

    def reload(self) -> None:
        """Read ``/proc/PID/maps`` again (a library loaded since)."""
        ranges = []
        with open(f"/proc/{self.pid}/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                lo, _, hi = parts[0].partition("-")
                ranges.append((int(lo, 16), int(hi, 16), parts[5].strip() if len(parts) > 5 else ""))
        self.ranges = ranges

    def name(self, address: int) -> str | None:
        """The path (or ``[vdso]``-like name, or ``""`` for anonymous memory) mapped at ``address``."""
        for lo, hi, name in self.ranges:
            if lo <= address < hi:
                return name
        return None


def classify(syscall_line: str, maps: Maps, arch: str) -> tuple[bool, str]:
    """Whether a thread stopped as ``/proc/PID/syscall`` says is at a safe point, and where it is.

    Args:
        syscall_line: ``"NR ARG1..ARG6 SP PC"`` (in a system call), ``"-1 SP PC"`` (in user
            code) or ``"running"``.
        maps: the target's mappings.
        arch: ``os.uname().machine``.

    Returns:
        ``(safe, where)``, e.g. ``(True, "futex")``, ``(False, "libc.so.6")``.
    """
    fields = syscall_line.split()
    if not fields or fields[0] == "running":
        return False, "running"
    try:
        nr = int(fields[0])
        pc = int(fields[-1], 16)
    except ValueError:
        return False, "unreadable"
    if nr >= 0:
        name = _WAITING_SYSCALLS.get(arch, {}).get(nr)
        return (True, name) if name else (False, f"syscall {nr}")
    path = maps.name(pc)
    if path is None:
        maps.reload()
        path = maps.name(pc)
    if path is None or path == "":
        return False, "anonymous memory"
    if path in _SAFE_SPECIAL:
        return True, path
    if path.startswith("[") or os.path.realpath(path) == maps.exe:
        return False, path
    base = os.path.basename(path)
    return (not _UNSAFE_LIBS.match(base)), base


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_PTRACE_GETREGSET, _PTRACE_SETREGSET = 0x4204, 0x4205
# The whole floating-point and vector state: the XSAVE area on x86_64 (x87, SSE, AVX, AVX-512,
# AMX), the FP/SIMD registers on aarch64 (elf.h: NT_X86_XSTATE, NT_PRFPREG).
_VECTOR_NOTE = {"x86_64": 0x202, "aarch64": 2}
_VECTOR_MAX = 64 * 1024  # XSAVE with AMX tiles is ~11 KiB


class VectorState:
    """The stopped thread's floating-point and vector registers, saved now and put back by :meth:`restore`.

    pyinjector saves and restores only the general registers around the code it runs on the
    target's thread, but ``dlopen`` and the Python code it runs use the SSE/AVX registers: a
    thread stopped in the middle of a computation (a torch kernel) then resumed with other
    values in them computes wrong numbers. Measured here: the cpu_bound demo's loss turned NaN
    after a few dozen injections without this, and stayed finite with it.

    Must be called from the thread that attached (ptrace requests belong to the tracer thread).

    Raises:
        OSError: the architecture is not known here, or the kernel refused the request.
    """

    def __init__(self, pid: int, arch: str) -> None:
        self.pid = pid
        note = _VECTOR_NOTE.get(arch)
        if note is None:
            raise OSError(f"cannot save the vector registers on {arch}")
        self.note = note
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self.libc.ptrace.restype = ctypes.c_long
        self.buf = ctypes.create_string_buffer(_VECTOR_MAX)
        self.iov = _IoVec(ctypes.cast(self.buf, ctypes.c_void_p), _VECTOR_MAX)
        self._call(_PTRACE_GETREGSET, "save")

    def _call(self, request: int, what: str) -> None:
        if self.libc.ptrace(request, self.pid, self.note, ctypes.byref(self.iov)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot {what} the vector registers of PID {self.pid}: {os.strerror(err)}")

    def restore(self) -> None:
        """Put the saved registers back (``iov.len`` is the size the kernel filled in)."""
        self._call(_PTRACE_SETREGSET, "restore")


def library_with_code(code: bytes) -> bytes:
    """hypno's injection library with ``code`` in its code slot (what ``hypno.inject_py`` writes).

    Raises:
        ValueError: the code is too long, or hypno's library does not have the expected layout.
    """
    from hypno.api import INJECTION_LIB_PATH  # type: ignore[import-untyped]

    lib: bytes = INJECTION_LIB_PATH.read_bytes()
    at = lib.find(MAGIC)
    if at < 1:
        raise ValueError("hypno's injection library has an unexpected layout: pip install 'hypno>=1.1,<2'")
    end = lib.find(b"\0", at + len(MAGIC))
    limit = int(lib[at + len(MAGIC) : end])
    if len(code) > limit:
        raise ValueError(f"injected code is {len(code)} bytes, hypno takes at most {limit}")
    start = at - 1
    return lib[:start] + code + b"\0" + lib[start + len(code) + 1 :]


def _start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            after = f.read(4096).rpartition(b")")[2].split()
    except OSError:
        return None
    return after[19].decode() if len(after) > 19 else None


def inject(pid: int, start_ticks: str, library: str, window_s: float) -> dict[str, Any]:
    """Load ``library`` into ``pid`` at the first safe point within ``window_s`` seconds.

    Returns:
        ``{"ok", "error"?, "tries", "where", "held_s" (longest ptrace stop, s), "load_s"}``.
    """
    try:
        from pyinjector import attach  # type: ignore[import-untyped]
    except ImportError as exc:
        return {"ok": False, "error": f"pyinjector cannot be imported: {exc}", "tries": 0}
    arch = os.uname().machine
    maps = Maps(pid)
    deadline = time.monotonic() + window_s
    tries, held, where = 0, 0.0, ""
    while True:
        if _start_ticks(pid) != start_ticks:
            return {"ok": False, "error": f"PID {pid} exited (or is another process now)", "tries": tries}
        tries += 1
        loaded = False
        t0 = time.monotonic()
        with attach(pid) as injector:
            with open(f"/proc/{pid}/syscall") as f:
                safe, where = classify(f.read(), maps, arch)
            if safe:
                vector = VectorState(pid, arch)  # raises OSError: then nothing is injected
                t1 = time.monotonic()
                try:
                    handle = injector.inject(library.encode())
                    injector.uninject(handle)
                finally:
                    vector.restore()
                load = time.monotonic() - t1
                loaded = True
        held = max(held, time.monotonic() - t0)
        if loaded:
            return {"ok": True, "tries": tries, "where": where, "held_s": held, "load_s": load}
        if time.monotonic() > deadline:
            return {
                "ok": False,
                "error": f"no safe moment to stop PID {pid} in {window_s:g} s (its main thread was always in "
                f"the interpreter or the C library, last in {where}); nothing was injected",
                "tries": tries,
                "held_s": held,
            }
        time.sleep(random.uniform(0.002, 0.01))


def serve() -> int:
    """Answer requests, one JSON object a line on stdin (``pid``, ``start_ticks``, ``library``,
    ``window_s``), with one JSON line on stdout each, until stdin closes."""
    for line in sys.stdin:
        try:
            req = json.loads(line)
            out = inject(int(req["pid"]), str(req["start_ticks"]), str(req["library"]), float(req["window_s"]))
        except Exception as exc:  # pyinjector's errors carry the kernel's reason
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    import signal

    # A Ctrl-C, hang-up or stop signal meant for torchwatch (its whole process group gets the
    # terminal's) must not end the helper half-way through an injection, with the target's
    # registers changed: it ends when torchwatch closes its stdin, or exits.
    for _sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(_sig, signal.SIG_IGN)
    sys.exit(serve())
