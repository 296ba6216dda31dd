"""Starting a training under the guard, and stopping it whatever stops torchwatch.

- :func:`launch` starts COMMAND through :mod:`torchwatch.watch.guard`, so that the training (with its
  DataLoader workers and anything else it starts) is SIGKILLed within milliseconds if torchwatch
  itself is killed or crashes.
- :class:`StopSignals` turns SIGINT, SIGTERM and SIGHUP into a request that the watch loop (or the
  TUI) reads: the training is stopped and the report written before torchwatch ends, by the same
  signal (so a shell sees 128+N).
- :func:`stop_launched` stops the launched tree in steps, each step cut short by a further signal.

Signals torchwatch sends (each to what is left of the tree, as :class:`psutil.Process` handles
that check the process's start time, so a reused PID is never signalled):

=====================  =====================================================================
stopped by             steps
=====================  =====================================================================
``--duration``, ``q``  SIGINT to the command and each training process that catches it, 10 s
                       (only if one does); SIGTERM to all, 5 s; SIGKILL
Ctrl-C (SIGINT)        as above; when the training shares torchwatch's process group and
                       torchwatch leads its terminal's foreground group, the terminal already
                       sent SIGINT to the training, so torchwatch does not send it again
SIGTERM, SIGHUP        the same signal to the command, 5 s; SIGTERM to all, 5 s; SIGKILL
a second signal        ends the current wait: the next step now
=====================  =====================================================================

Whatever the command leaves behind when it exits (DataLoader workers whose main process was
killed: PyTorch's own watchdog stops them only after up to 5 s) gets SIGTERM, 1 s, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

import psutil

from torchwatch.model.errors import TorchwatchError, shell_status
from torchwatch.sources.proc import catches
from torchwatch.watch.target import check_command

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
INTERRUPT_GRACE_S = 10.0  # after SIGINT: a training's KeyboardInterrupt handler may save a checkpoint
TERMINATE_GRACE_S = 5.0  # after SIGTERM (or SIGHUP): docker stop waits 10 s before its own SIGKILL
LEFTOVER_GRACE_S = 1.0  # processes the command left behind, after SIGTERM
GUARD = Path(__file__).with_name("guard.py")
STATUS_UNKNOWN = 255  # the command's exit status when its guard was killed apart from torchwatch


Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class Launched:
    """A command started by :func:`launch`, watched through its guard.

    Attributes:
        pid: PID of the command (a child of the guard, which is torchwatch's child).
        args: the command line.
        own_group: the command leads a process group of its own (:func:`needs_own_group`).
        returncode: ``None`` while the command runs; then its exit code, or ``-N`` when signal N
            ended it (as :attr:`subprocess.Popen.returncode`).
    """

    def __init__(
        self, guard: subprocess.Popen[bytes], ctl: int, status: int, args: Sequence[str], own_group: bool = False
    ) -> None:
        self._guard = guard
        self.own_group = own_group
        self._ctl: int | None = ctl
        self._status: int | None = status
        # One reader of the status pipe at a time: the main thread waits in wait() while the
        # analysis thread calls poll(); two readers once lost the "exit" line between one's
        # select() and the other's read(), and the first then blocked in read() for good.
        self._reading = threading.Lock()
        os.set_blocking(status, False)
        self._buffer = b""
        self._eof = False
        self.args = list(args)
        self.returncode: int | None = None
        line = self._line(timeout=30.0)
        if line is None or not line.startswith("pid "):
            reason = "the guard process did not start it"
            if line is not None and line.startswith("error "):
                _, code, text = [*line.split(" ", 2), "", ""][:3]
                reason = text or os.strerror(int(code) if code.isdigit() else errno.EIO)
            self.close()
            raise TorchwatchError(f"cannot start {self.args[0]}: {reason}", "check the command")
        self.pid = int(line.split()[1])
        log.debug("started %s as PID %d under the guard PID %d", self.args, self.pid, guard.pid)

    def _line(self, timeout: float, wake_fd: int | None = None) -> str | None:
        """The next status line from the guard; ``None`` at end of file, after ``timeout`` s, or
        once ``wake_fd`` is readable."""
        status = self._status
        if status is None:
            return None
        deadline = time.monotonic() + timeout
        fds = [status] if wake_fd is None else [status, wake_fd]
        while b"\n" not in self._buffer:
            left = max(0.0, deadline - time.monotonic())  # 0: look once without waiting
            if status not in select.select(fds, [], [], left)[0]:
                return None
            try:
                data = os.read(status, 4096)
            except BlockingIOError:  # nothing after all (the descriptor never blocks)
                continue
            except OSError:
                data = b""
            if not data:
                self._eof = True
                return None
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace")

    def poll(self) -> int | None:
        """The command's exit status once it has ended (non-blocking), else ``None``. From any
        thread: while another thread waits (:meth:`wait`), that one reads the guard's news and
        this returns what is known now."""
        if self.returncode is not None or not self._reading.acquire(blocking=False):
            return self.returncode
        try:
            return self._wait(0.0, None)
        finally:
            self._reading.release()

    def wait(self, timeout: float | None = None, wake_fd: int | None = None) -> int | None:
        """Wait up to ``timeout`` s (``None``: for ever) for the command to end; its status or ``None``.
        One thread waits at a time; another's wait queues behind it, within its own timeout.

        Args:
            timeout: s to wait at most.
            wake_fd: a file descriptor that ends the wait early once readable
                (:attr:`StopSignals.wake_fd`: a stop signal arrived); it is not read.
        """
        if self.returncode is not None:
            return self.returncode
        start = time.monotonic()
        if not self._reading.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            return self.returncode
        try:
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
            return self._wait(left, wake_fd)
        finally:
            self._reading.release()

    def _wait(self, timeout: float | None, wake_fd: int | None) -> int | None:
        """:meth:`wait`, the reading lock held."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 3600.0 if deadline is None else max(0.0, deadline - time.monotonic())
            line = None if self._eof else self._line(left, wake_fd)
            if line is not None:
                if line.startswith("exit "):
                    self.returncode = int(line.split()[1])
                continue
            if self._status is None:  # closed: nothing more will come
                break
            if wake_fd is not None and select.select([wake_fd], [], [], 0)[0]:
                break
            if self._eof:
                # The guard was killed on its own: the command now belongs to init and its exit
                # status cannot be known; only whether it still runs.
                if not _alive(self.pid):
                    self.returncode = STATUS_UNKNOWN
                    break
                time.sleep(min(0.1, left))
            if deadline is not None and time.monotonic() >= deadline:
                break
        return self.returncode

    def procs(self) -> list[psutil.Process]:
        """Every process of the launched tree still running: the command, its descendants and the
        orphans the guard collected."""
        try:
            return psutil.Process(self._guard.pid).children(recursive=True)
        except psutil.Error:
            return []

    def leave_running(self) -> None:
        """Let the command run on after torchwatch exits (the guard ends now)."""
        self._tell(b"L")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._guard.wait(timeout=5.0)

    def close(self) -> None:
        """Torchwatch is done with the command: the guard ends, and is waited for (≤ 5 s)."""
        self._tell(b"D")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._guard.wait(timeout=5.0)
        # not while another thread reads it (a closed number may be reused by the next open)
        with self._reading:
            status, self._status = self._status, None
        if status is not None:
            with contextlib.suppress(OSError):
                os.close(status)

    def _tell(self, what: bytes) -> None:
        if self._ctl is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._ctl, what)
        with contextlib.suppress(OSError):
            os.close(self._ctl)
        self._ctl = None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def launch(
    command: Sequence[str],
    *,
    stdout: IO[bytes] | int | None = None,
    stderr: IO[bytes] | int | None = None,
    stdin: int | None = None,
    env: dict[str, str] | None = None,
    own_group: bool = False,
) -> Launched:
    """Start ``command`` under the guard.

    Args:
        command: program and arguments, e.g. ``["python", "train.py"]``.
        stdout, stderr: where the command writes (a file, a descriptor, ``subprocess.STDOUT`` for
            stderr); ``None`` passes torchwatch's own through.
        stdin: ``subprocess.DEVNULL`` when the TUI owns the terminal.
        env: the command's environment; ``None`` inherits torchwatch's.
        own_group: put the command in a process group of its own; otherwise it shares
            torchwatch's, so a terminal's Ctrl-C and Ctrl-Z reach both (see :func:`needs_own_group`).

    Raises:
        UsageError: empty command.
        TorchwatchError: the program is not found, not executable, or cannot be started.
    """
    check_command(command)
    ctl_r, ctl_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        guard = subprocess.Popen(
            [
                *(sys.executable, "-I", "-S", str(GUARD), str(ctl_r), str(status_w)),
                *(["--new-group"] if own_group else []),
                *("--", *command),
            ],
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=env,
            pass_fds=(ctl_r, status_w),
        )
    except OSError as exc:
        for fd in (ctl_r, ctl_w, status_r, status_w):
            os.close(fd)
        raise TorchwatchError(f"cannot start {command[0]}: {exc.strerror or exc}", "check the command") from None
    os.close(ctl_r)
    os.close(status_w)
    os.set_inheritable(ctl_w, False)
    return Launched(guard, ctl_w, status_r, command, own_group)


def has_controlling_terminal() -> bool:
    """Whether torchwatch has a controlling terminal (``/dev/tty`` opens), tty(4)."""
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
        return True
    except OSError:
        return False


def needs_own_group(tui: bool) -> bool:
    """Whether the launched command gets a process group of its own.

    A signal to a whole process group reaches every member directly; a command sharing
    torchwatch's group would then get it twice, once more when torchwatch passes it on (a second
    KeyboardInterrupt lands in the training's own clean-up). So the command shares torchwatch's
    group only where it must share its terminal: ``--headless`` with a controlling terminal
    (Ctrl-C and Ctrl-Z stop both; ``pdb`` can read the terminal, which a background group may
    not). Under the TUI the command has no terminal (stdin is ``/dev/null``, output goes to a log)
    and the terminal is raw: Ctrl-C is a key, and a hang-up reaches torchwatch alone.
    """
    return tui or not has_controlling_terminal()


def terminal_delivers_interrupts() -> bool:
    """Whether a SIGINT to torchwatch most likely came from its terminal's Ctrl-C, which the
    kernel sends to the whole foreground process group, the training included.

    True when torchwatch's process group is the foreground group of the terminal on stdin,
    stdout or stderr (tcgetpgrp(3)). A signal cannot tell who sent it to a Python handler, so a
    ``kill -INT`` from elsewhere while torchwatch runs in the foreground counts as Ctrl-C too.
    """
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            if stream is not None and os.tcgetpgrp(stream.fileno()) == os.getpgrp():
                return True
    return False


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP while torchwatch watches: recorded for the watch loop, never fatal.

    A signal torchwatch was started with as ignored (``nohup`` ignores SIGHUP) stays ignored.
    Used as a context manager; the previous handlers come back on exit.

    The handler only appends to a list and writes a byte to a pipe: it takes no lock. Python runs
    a handler in the main thread between two bytecodes, and the main thread is the one that waits
    for the signal; a handler that set a ``threading.Event`` would take the Event's lock, which
    that same thread holds for a few bytecodes of every ``Event.wait`` (not reentrant): a stop
    signal landing there blocked torchwatch for ever, so a scheduler's SIGTERM got no report.

    Attributes:
        received: the signals received, in order.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, Handler] = {}
        self._wake: tuple[int, int] | None = None

    @property
    def wake_fd(self) -> int | None:
        """A file descriptor that turns readable when a stop signal arrives, for a loop that
        sleeps in ``select`` (:meth:`Launched.wait`), where Python retries the call after the
        handler ran (PEP 475) instead of returning; ``None`` while not installed."""
        return self._wake[0] if self._wake is not None else None

    @property
    def first(self) -> int | None:
        """The first stop signal received, or ``None``."""
        return self.received[0] if self.received else None

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` s, less once a stop signal arrives; whether one has arrived.

        Sleeps in ``select`` on :attr:`wake_fd` (not read, so every later wait returns at once
        too); before :meth:`install` or off the main thread (no pipe), a plain sleep.
        """
        if self.received:
            return True
        if self._wake is None:
            time.sleep(max(0.0, timeout))
        else:
            with contextlib.suppress(OSError, ValueError):  # closed by restore() meanwhile
                select.select([self._wake[0]], [], [], max(0.0, timeout))
        return bool(self.received)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # No lock may be taken here (see the class): no logging (a handler may run inside a
        # logging call, whose lock it would take again), no threading.Event.
        self.received.append(signum)
        if self._wake is not None:
            with contextlib.suppress(OSError):  # full (a byte is already there) or closed
                os.write(self._wake[1], b"\0")

    def install(self) -> None:
        """Catch the stop signals (main thread only; elsewhere this does nothing)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if self._wake is None:
            self._wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        for sig in STOP_SIGNALS:
            previous = signal.getsignal(sig)
            if previous is signal.SIG_IGN:
                continue
            self._previous[sig] = previous
            signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        if self._wake is not None:
            for fd in self._wake:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake = None

    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def exit_like_the_signal(self) -> None:
        """End torchwatch by the first signal received, with its default action (after the report):
        a shell then sees 128+N and a script that ran torchwatch stops too, as after Ctrl-C on any
        program. Returns only when no signal was received."""
        sig = self.first
        if sig is None:
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self.restore()
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        time.sleep(1.0)  # the signal is delivered at once; this only bounds a blocked one


def _signal_all(procs: Sequence[psutil.Process], sig: int) -> None:
    if procs:
        log.debug("sending %s to %s", signal.Signals(sig).name, [p.pid for p in procs])
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            proc.send_signal(sig)


class _Steps:
    """The waits of one stop: each ends early when a further stop signal arrives."""

    def __init__(self, child: Launched, signals: StopSignals | None) -> None:
        self.child = child
        self.signals = signals
        self.seen = len(signals.received) if signals else 0

    def hurried(self) -> bool:
        """Whether a stop signal arrived since the last call (or the start of the stop)."""
        now = len(self.signals.received) if self.signals else 0
        hurried, self.seen = now > self.seen, now
        return hurried

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the command to end, less if hurried; whether it ended."""
        self.hurried()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.child.wait(0.05) is not None:
                return True
            if self.hurried():
                break
        return self.child.poll() is not None


def stop_launched(
    child: Launched,
    mains: Sequence[int] = (),
    *,
    first: int = signal.SIGINT,
    already_sent: bool = False,
    signals: StopSignals | None = None,
) -> int:
    """Stop a launched command and everything it started (see the table in the module docstring).

    Args:
        child: the launched command.
        mains: PIDs of its training processes (ranks): they get SIGINT beside the command.
        first: the first signal: SIGINT (``--duration``, ``q``, Ctrl-C), SIGTERM or SIGHUP
            (passed on from torchwatch's own).
        already_sent: the terminal already delivered ``first`` (SIGINT) to the whole process group.
        signals: the stop signals torchwatch catches: each one received during the stop ends the
            current wait.

    Returns:
        The command's shell-style exit status (128+N when signal N ended it).
    """
    steps = _Steps(child, signals)
    if child.poll() is None:
        if first == signal.SIGINT:
            catching = [p for p in _procs([child.pid, *mains]) if catches(p.pid, signal.SIGINT)]
            if not already_sent:
                _signal_all(catching, signal.SIGINT)
            # Nothing catches SIGINT: it was ignored, or it already ended its target. No wait then.
            ended = steps.wait(INTERRUPT_GRACE_S) if catching else child.wait(0.1) is not None
        else:
            _signal_all(_procs([child.pid]), first)
            ended = steps.wait(TERMINATE_GRACE_S)
        if not ended:
            _signal_all(child.procs(), signal.SIGTERM)
            ended = steps.wait(TERMINATE_GRACE_S)
        if not ended:
            _signal_all(child.procs(), signal.SIGKILL)
            child.wait(TERMINATE_GRACE_S)
    stop_leftovers(child, hurry=steps.hurried())
    code = child.poll()
    return shell_status(code if code is not None else -signal.SIGKILL)


def stop_leftovers(child: Launched, hurry: bool = False) -> None:
    """SIGTERM, then after :data:`LEFTOVER_GRACE_S` (none when ``hurry``) SIGKILL, whatever of the
    launched tree still runs."""
    left = child.procs()
    if not left:
        return
    _signal_all(left, signal.SIGTERM)
    _, left = psutil.wait_procs(left, timeout=0.0 if hurry else LEFTOVER_GRACE_S)
    _signal_all(left, signal.SIGKILL)
    psutil.wait_procs(left, timeout=LEFTOVER_GRACE_S)


def _procs(pids: Sequence[int]) -> list[psutil.Process]:
    procs = []
    for pid in dict.fromkeys(pids):
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    return procs


def hook_env(burst_at: tuple[int, ...] = (), boot_note: Path | None = None) -> dict[str, str]:
    """The environment that pre-loads the hook in a launched training (``boot/sitecustomize.py``).

    ``TORCHWATCH_HOOK_PATH`` is the directory holding this torchwatch package: the boot loads the
    hook from there by path (:mod:`torchwatch.wire.bypath`), whatever ``torchwatch`` the training's
    own environment holds, or none. ``boot_note``: a file (not yet there, in a directory of this
    user) where the boot writes one line saying why the hook could not be loaded
    (``TORCHWATCH_BOOT_NOTE``, read by :class:`torchwatch.sources.hook.HookSource`).
    """
    import torchwatch
    import torchwatch.hook

    env = dict(os.environ)
    boot = str(Path(torchwatch.hook.__file__).parent / "boot")
    env["PYTHONPATH"] = boot + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TORCHWATCH_HOOK"] = "1"
    env["TORCHWATCH_HOOK_PATH"] = str(Path(torchwatch.__file__).parent.parent)
    env.pop("TORCHWATCH_BOOT_NOTE", None)
    if boot_note is not None:
        env["TORCHWATCH_BOOT_NOTE"] = str(boot_note)
    if burst_at:
        env["TORCHWATCH_BURST_AT"] = ",".join(str(s) for s in burst_at)
    return env
