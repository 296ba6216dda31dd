"""Helper process: load a shared library into a Python process with ptrace, at a safe moment.

Started once by :class:`torchwatch.inject.injector.Injector` as ``python -I _ptrace.py`` and
then asked over its stdin (one JSON request a line, one JSON answer a line, after a first
line saying it is ready; see :func:`serve`), so the interpreter's start-up (~0.1 s of CPU) is
neither paid while a training is held nor counted in an injection's time. It imports nothing
from torchwatch (``-I`` and a script path: no current directory, no ``PYTHONPATH`` on its
``sys.path``). A separate process, not a thread of torchwatch,
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

import contextlib
import ctypes
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable
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
# Waits on a lock or condition: never safe, whoever waits. The interpreter waits on futexes inside
# the GIL's hand-over too (take_gil, drop_gil's switch condition), where code run on the thread
# takes the GIL again and can wait on the condition the suspended wait was signalled for: a
# training with DataLoader workers was left stuck so, 3 times in 6 runs of 25 injections.
_LOCK_WAITS = frozenset({"futex", "futex_waitv"})
# Where a waiting system call is made from on behalf of its caller: skipped when looking for the caller.
_WAIT_WRAPPERS = re.compile(r"^(libc[.-]|ld-linux|ld-musl|libpthread)")
STACK_SCAN_BYTES = 16 * 1024


class Maps:
    """The target's memory mappings: which file an address belongs to, and which are code."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exe = os.path.realpath(f"/proc/{pid}/exe")
        self.ranges: list[tuple[int, int, str]] = []
        self.code: list[tuple[int, int, str]] = []
        self.reload()

    def reload(self) -> None:
        """Read ``/proc/PID/maps`` again (a library loaded since)."""
        ranges, code = [], []
        with open(f"/proc/{self.pid}/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                lo, _, hi = parts[0].partition("-")
                entry = (int(lo, 16), int(hi, 16), parts[5].strip() if len(parts) > 5 else "")
                ranges.append(entry)
                if "x" in parts[1]:
                    code.append(entry)
        self.ranges, self.code = ranges, code

    def name(self, address: int) -> str | None:
        """The path (or ``[vdso]``-like name, or ``""`` for anonymous memory) mapped at ``address``."""
        for lo, hi, name in self.ranges:
            if lo <= address < hi:
                return name
        return None

    def code_name(self, address: int) -> str | None:
        """The file of the executable mapping holding ``address``; ``None`` when it is no code."""
        for lo, hi, name in self.code:
            if lo <= address < hi:
                return name
        return None

    def end_of(self, address: int) -> int | None:
        """The end of the mapping holding ``address`` (how much stack there is to read above SP)."""
        for lo, hi, _ in self.ranges:
            if lo <= address < hi:
                return hi
        return None


def waiter(stack: bytes, maps: Maps) -> str | None:
    """The library that made a waiting system call: the first return address found scanning up
    the stack from the stack pointer that lies in code outside the C library (which holds the
    wait functions themselves); ``None`` when none is found.

    A scan for code addresses can take a stale value for a return address; it errs towards
    "unsafe" in practice, since the interpreter is the one caller that makes a wait safe.
    """
    for i in range(0, len(stack) - 7, 8):
        path = maps.code_name(int.from_bytes(stack[i : i + 8], "little"))
        if not path or path in _SAFE_SPECIAL or _WAIT_WRAPPERS.match(os.path.basename(path)):
            continue
        return path
    return None


def _interpreter(path: str, maps: Maps) -> bool:
    """CPython itself: its executable, libpython, or a standard-library extension module
    (``lib-dynload``: select, _queue, _socket, _multiprocessing), whose blocking calls release
    the GIL and hold no lock of their own while they wait."""
    base = os.path.basename(path)
    return os.path.realpath(path) == maps.exe or base.startswith("libpython") or "/lib-dynload/" in path


def classify(
    syscall_line: str, maps: Maps, arch: str, read_stack: Callable[[int], bytes] | None = None
) -> tuple[bool, str]:
    """Whether a thread stopped as ``/proc/PID/syscall`` says is at a safe point, and where it is.

    A waiting system call is safe only when the interpreter made it outside its own locks
    (time.sleep, select and poll, reading a pipe or socket): code run on the thread then meets no
    lock the thread holds. A futex wait never is (see :data:`_LOCK_WAITS`).
    A wait made from a library's own code (a mutex inside a torch op, seen in PyTorch's
    ``record_function`` while a DataLoader's workers started) may hold a lock the injected code
    then needs, or hold the GIL that another thread needs to let that lock go: injecting there
    left a training with DataLoader workers stuck for good.

    Args:
        syscall_line: ``"NR ARG1..ARG6 SP PC"`` (in a system call), ``"-1 SP PC"`` (in user
            code) or ``"running"``.
        maps: the target's mappings.
        arch: ``os.uname().machine``.
        read_stack: reads :data:`STACK_SCAN_BYTES` (or up to the mapping's end) of the thread's
            stack from an address; ``None`` skips the caller check (tests of the rest).

    Returns:
        ``(safe, where)``, e.g. ``(True, "futex from libpython3.11.so.1.0")``,
        ``(False, "futex from libtorch_cpu.so")``, ``(False, "libc.so.6")``.
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
        if not name:
            return False, f"syscall {nr}"
        if name in _LOCK_WAITS:
            return False, f"{name} (a lock wait)"
        if read_stack is None:
            return True, name
        try:
            caller = waiter(read_stack(int(fields[-2], 16)), maps)
        except (OSError, ValueError):
            return False, f"{name}, its stack unreadable"
        if caller is None:
            return False, f"{name} from unknown code"
        return _interpreter(caller, maps), f"{name} from {os.path.basename(caller)}"
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


_PTRACE_GETSIGMASK, _PTRACE_SETSIGMASK = 0x420A, 0x420B  # linux/ptrace.h, since Linux 3.11
_PTRACE_SEIZE, _PTRACE_INTERRUPT, _PTRACE_DETACH = 0x4206, 0x4207, 17
_PTRACE_EVENT_STOP = 128
_WALL = 0x40000000  # waitpid: any thread, clone or not
_SIGSET_BYTES = 8  # the kernel's sigset_t: 64 signals
_ALL_SIGNALS = (1 << 64) - 1  # SIGKILL and SIGSTOP cannot be blocked: the kernel leaves them out
# Bits that may differ from "everything blocked" while it is still in force: SIGKILL and SIGSTOP
# (never blocked) and SIGTRAP, which pyinjector unblocks while it holds the thread (seen: the
# mask read 0x...feef under pyinjector for the 0x...feff set).
_NOT_COMPARED = (1 << (9 - 1)) | (1 << (19 - 1)) | (1 << (5 - 1))


class BlockedSignals:
    """Every signal blocked on the target's main thread for the ``with`` block, then its own mask back.

    pyinjector runs code on the target's thread (a remote ``mmap`` when it attaches, then
    ``dlopen``) by setting its registers and letting it go until it traps back. A signal that
    arrives meanwhile (an interval timer's SIGALRM, the SIGCHLD of a forked child or of a
    DataLoader worker, which PyTorch handles) stops the thread in signal-delivery-stop first;
    pyinjector takes that for failure and gives up half way, its code and registers in place
    ("The target process unexpectedly stopped by signal 14"). Seen with a 100 Hz and a 2 kHz
    timer, a fork every step and DataLoader workers: trainings stuck for good, or corrupted
    (``SystemError: unknown opcode``).

    So, as a debugger holds them, the signals wait: this seizes the thread (``PTRACE_SEIZE`` +
    ``PTRACE_INTERRUPT``, no SIGSTOP sent), saves its mask, blocks everything and lets it go;
    pyinjector then attaches and calls with no signal able to stop the thread; at the end the
    saved mask goes back the same way. Meanwhile a process-directed signal goes to another
    thread that does not block it (CPython's C handler only flags it for the main thread) or
    waits, pending, for the mask to come back (ticks of a timer that came meanwhile arrive as
    one, as under any load). A signal that was being delivered when the thread was seized is
    handed back to it as the seize ends.

    The mask read when the thread is seized is not always its own: seized inside a signal
    handler (its C part, microseconds, at a 2 kHz timer's pace), the thread's mask holds that
    signal until the handler returns, and the return (``sigreturn``) then puts back the mask of
    before the handler, over the one set here. Put back blindly, the saved mask left SIGALRM
    blocked for good and the injection that followed ran unprotected (a training's interpreter
    was left unreadable, once in 1,200 injections). So the mask is read again once pyinjector
    holds the thread (:meth:`hold`): if it is no longer "everything blocked", the thread's own
    mask is the one read then, and everything is blocked again for the calls; :meth:`release`
    puts the thread's own mask back while pyinjector still holds it. When pyinjector never got
    hold of it, the end of the ``with`` block puts the saved mask back only if "everything
    blocked" is still in force (else the thread has its own mask again).

    Must be used from one thread (ptrace requests belong to the tracer thread).

    Raises:
        OSError: the thread could not be seized or its mask read or set (then nothing was changed,
            or the saved mask was put back), or the process exited.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self.libc.ptrace.restype = ctypes.c_long
        self.saved: ctypes.c_uint64 | None = None
        self.own: ctypes.c_uint64 | None = None  # the thread's own mask, once known while held
        self.released = False
        self.everything = _ALL_SIGNALS

    def _get(self) -> ctypes.c_uint64:
        mask = ctypes.c_uint64(0)
        self._ptrace(_PTRACE_GETSIGMASK, _SIGSET_BYTES, ctypes.addressof(mask), "read the signal mask")
        return mask

    def _set(self, mask: ctypes.c_uint64, what: str) -> None:
        self._ptrace(_PTRACE_SETSIGMASK, _SIGSET_BYTES, ctypes.addressof(mask), what)

    def _ours(self, mask: int) -> bool:
        """``mask`` is still the "everything blocked" set here."""
        return mask | _NOT_COMPARED == self.everything | _NOT_COMPARED

    def hold(self) -> None:
        """With the thread held by pyinjector (the same tracer thread): find its own mask and make
        sure everything is blocked for the calls to come."""
        now = self._get()
        if self._ours(now.value):
            self.own = self.saved
        else:  # a handler returned since, or the thread set its mask itself: that mask is its own
            self.own = now
            self._set(ctypes.c_uint64(_ALL_SIGNALS), "block the signals")

    def release(self) -> None:
        """With the thread still held by pyinjector: its own mask back."""
        if self.own is not None:
            self._set(self.own, "restore the mask")
            self.released = True

    def __enter__(self) -> BlockedSignals:
        found: list[ctypes.c_uint64] = []

        def block() -> None:
            found.append(self._get())
            self._set(ctypes.c_uint64(_ALL_SIGNALS), "block the signals")
            self.everything = self._get().value  # as the kernel keeps it: SIGKILL, SIGSTOP and the like left out

        self._stopped(block)
        self.saved = found[0]
        return self

    def __exit__(self, *exc: object) -> None:
        saved = self.saved
        if saved is None or self.released:
            return

        def restore() -> None:
            if self._ours(self._get().value):  # still ours: else the thread has its own mask again
                self._set(saved, "restore the mask")

        self._stopped(restore)

    def _ptrace(self, request: int, addr: int, data: int, what: str) -> None:
        if self.libc.ptrace(request, self.pid, addr, data) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot {what} of PID {self.pid}: {os.strerror(err)}")

    def _stopped(self, action: Callable[[], None]) -> None:
        """Run ``action`` while the thread is in a ptrace-stop of this seize, then let it go."""
        self._ptrace(_PTRACE_SEIZE, 0, 0, "seize the main thread")
        resume_with = 0
        try:
            self._ptrace(_PTRACE_INTERRUPT, 0, 0, "stop the main thread")
            while True:
                _, status = os.waitpid(self.pid, _WALL)
                if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                    raise OSError(f"PID {self.pid} exited")
                if os.WIFSTOPPED(status):
                    if status >> 16 != _PTRACE_EVENT_STOP:
                        resume_with = os.WSTOPSIG(status)  # a signal on its way in: it goes on after
                    break
            action()
        finally:
            with contextlib.suppress(OSError):
                self._ptrace(_PTRACE_DETACH, 0, resume_with, "let the main thread go")


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


class _Stack:
    """Reads the target's stack through ``/proc/PID/mem`` (allowed to its tracer)."""

    def __init__(self, pid: int, maps: Maps) -> None:
        self.pid, self.maps = pid, maps

    def read(self, sp: int) -> bytes:
        """Up to :data:`STACK_SCAN_BYTES` from ``sp``, never past the end of its mapping.

        Raises:
            OSError: the memory could not be read.
        """
        end = self.maps.end_of(sp)
        if end is None:
            raise OSError(f"no mapping holds the stack pointer {sp:#x}")
        fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY)
        try:
            return os.pread(fd, min(STACK_SCAN_BYTES, end - sp), sp)
        finally:
            os.close(fd)


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
    stack = _Stack(pid, maps)
    deadline = time.monotonic() + window_s
    tries, held, where = 0, 0.0, ""
    while True:
        if _start_ticks(pid) != start_ticks:
            return {"ok": False, "error": f"PID {pid} exited (or is another process now)", "tries": tries}
        tries += 1
        loaded = False
        t0 = time.monotonic()
        with BlockedSignals(pid) as blocked, attach(pid) as injector:
            blocked.hold()
            try:
                with open(f"/proc/{pid}/syscall") as f:
                    safe, where = classify(f.read(), maps, arch, stack.read)
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
            finally:
                blocked.release()
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
    """Say it is ready (one JSON line, ``{"ready": true}``, once pyinjector is imported: the
    injector starts an injection's clock only then), then answer requests, one JSON object a
    line on stdin (``pid``, ``start_ticks``, ``library``, ``window_s``), with one JSON line on
    stdout each, until stdin closes."""
    with contextlib.suppress(ImportError):  # each request says so
        import pyinjector  # noqa: F401  # type: ignore[import-untyped]
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
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
