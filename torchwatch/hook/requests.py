"""The signal and request path (:class:`Requests`, mixed into
:class:`torchwatch.hook.runtime.Hook`): the burst signal's handler, ``request.json`` decoded
once into a typed request (:func:`wire.decode_request`) and dispatched to the burster or the
trials, and the timers' deadlines run in the main thread (the signal, or a pending call when the
training took the signal for itself). Nothing here raises into the training's code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from .. import wire
from . import patches
from .burst import BurstParams

if TYPE_CHECKING:
    from .burst import Burster
    from .trial import Trials

__all__ = ["Requests"]

_PENDING: list[Any] = []  # the ctypes callbacks handed to Py_AddPendingCall, kept alive until they run


class Requests:
    """The burst signal: taken (:meth:`_take_signal`), watched (:meth:`_check_signal`), handled
    (:meth:`_on_signal`); and the main-thread interrupts of the burst's and trial's timers.
    State set by :meth:`_init_requests`."""

    signum: int
    signal_error: str
    signal_owned: bool
    _handler_ref: Any
    _previous_handler: Any
    if TYPE_CHECKING:  # the hook's, used here (runtime.Hook, steps.StepClock)
        pid: int
        dir: Path
        counters: wire.Counters | None
        burster: Burster | None
        trials: Trials | None
        _last_step_t: float

        def publish(self) -> None: ...
        def error(self, message: str) -> None: ...

    def _init_requests(self, signum: int, signal_error: str) -> None:
        self.signum = signum if wire.signal_allowed(signum) else 0
        self.signal_error = signal_error or (f"signal {signum} is not allowed: bursts are off" if signum else "")
        self.signal_owned = False
        self._handler_ref = None
        self._previous_handler = None

    def _take_signal(self) -> None:
        """Install the burst signal handler, unless the training already handles that signal.

        Only SIGUSR1, SIGUSR2 and real-time signals (:func:`wire.burst_signals`); never raises.
        """
        try:
            if not self.signum:
                self.error(self.signal_error or "no burst signal: bursts are off")
                return
            if threading.current_thread() is not threading.main_thread():
                self.error("torch was imported outside the main thread: bursts are off")
                return
            name = wire.signal_name(self.signum)
            try:
                current = signal.getsignal(self.signum)
            except (ValueError, OSError) as exc:
                self.error(f"cannot read the handler of {name}: {exc}")
                return
            if current not in (signal.SIG_DFL, None):
                self.error(f"{name} is already handled by the training: bursts are off (set TORCHWATCH_SIGNAL)")
                return
            self._handler_ref = self._on_signal
            self._previous_handler = current
            signal.signal(self.signum, self._handler_ref)
            self.signal_owned = True
        except Exception as exc:
            self.error(f"cannot take the burst signal: {exc!r}")

    def _trial_busy(self) -> str | None:
        """Why a live trial cannot start now (a profiler burst would be timed with it)."""
        burster = self.burster
        if burster is not None and burster.state != "idle":
            return f"a profiler burst is {burster.state}: its cost would be timed as the setting's"
        if burster is not None and burster.wants_steps:
            return "the last burst's FLOP-counting mode has not left yet: its cost would be timed as the setting's"
        return None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGUSR2 (or the configured signal): arm a burst, or advance one (timer callbacks)."""
        if not patches._active:
            return
        try:
            burster = self.burster
            trials = self.trials
            if burster is None or trials is None:
                return
            now = time.monotonic()
            steps = self.counters.steps if self.counters is not None else 0
            req = self._take_request()
            if burster.state in ("armed", "running"):
                if req is not None and not isinstance(req, wire.BurstRequest):
                    trials.on_request(req, now, steps)  # refused, with the reason: a burst runs
                elif req is not None:
                    burster.request(req, now, True, "signal")  # refused: one runs
                burster.on_interrupt(now)  # a timer's deadline, if one is due (a no-op otherwise)
                return
            if req is not None and not isinstance(req, wire.BurstRequest):
                trials.on_request(req, now, steps)
                return
            if trials.active:
                if req is None:
                    trials.on_interrupt(now)  # the trial's max_s timer
                else:
                    why = "a live trial is running: its steps are being timed"
                    burster.last_refusal = wire.Refusal(now, why, "signal")
                    self.publish()
                return
            params = req if req is not None else BurstParams()
            stepping = self._last_step_t > 0 and now - self._last_step_t < max(2.0, params.arm_timeout_s)
            burster.request(params, now, stepping, "signal")
        except Exception as exc:
            self.error(f"burst request: {exc!r}")

    def _take_request(self) -> wire.Request | None:
        """``request.json`` (torchwatch writes it before the signal) decoded once
        (:func:`wire.decode_request`), then removed; ``None`` without one (a timer's
        interrupt). Accepted only as a regular file of this user or root, at most 4 KB."""
        try:
            fd = wire.open_dir(self.dir, (os.geteuid(),), private=True)
        except OSError:
            return None
        try:
            req = wire.read_json(fd, wire.REQUEST_FILE, {0, os.geteuid()}, wire.REQUEST_MAX_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self.error(f"burst request ignored: {exc}")
            return None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(wire.REQUEST_FILE, dir_fd=fd)
            os.close(fd)
        return wire.decode_request(req)

    def _interrupt_main(self) -> bool:
        """From a timer thread: run our signal handler in the main thread, without a real signal.

        When the training has taken the signal for itself, :meth:`_on_timer` runs there instead
        as a pending call (``Py_AddPendingCall``, which the interpreter runs in the main thread
        between two bytecodes, whatever its signal handlers): a trial's ``max_s`` and a burst's
        deadline hold whatever the training does with the signal.
        """
        try:
            if not patches._active:
                return False
            if not self._check_signal():
                return _pending_call(self._on_timer)
            import _thread

            _thread.interrupt_main(self.signum)  # type: ignore[arg-type]  # an int works since 3.10
        except Exception:
            return False
        return True

    def _on_timer(self) -> None:
        """A timer's deadline, in the main thread without the signal: end a trial past its
        ``max_s``, a burst past its window or ``max_s``. Never raises."""
        if not patches._active or os.getpid() != self.pid:
            return
        try:
            now = time.monotonic()
            if self.trials is not None and self.trials.active:
                self.trials.on_interrupt(now)
            if self.burster is not None:
                self.burster.on_interrupt(now)
        except Exception as exc:
            self.error(f"timer: {exc!r}")

    def _check_signal(self) -> bool:
        """Whether our handler still owns the signal (the training may install its own later)."""
        if self._handler_ref is None:
            return False
        try:
            owned = bool(signal.getsignal(self.signum) == self._handler_ref)
        except (ValueError, OSError):
            owned = False
        if owned != self.signal_owned:
            self.signal_owned = owned
            if not owned:
                self.error("the training replaced the burst signal's handler: bursts are off")
            self.publish()
        return owned


def _pending_call(function: Callable[[], None]) -> bool:
    """Have ``function()`` run in the main thread at its next bytecode (CPython's
    ``Py_AddPendingCall``), whatever the training did with its signal handlers. False when it
    cannot be queued (no ctypes, the queue full). The call never raises into the training."""
    try:
        import ctypes

        def run(_arg: Any) -> int:
            with contextlib.suppress(BaseException):  # never into the training's code
                function()
            with contextlib.suppress(ValueError):
                _PENDING.remove(callback)
            return 0

        callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(run)
        add = ctypes.pythonapi.Py_AddPendingCall
        add.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        add.restype = ctypes.c_int
        _PENDING.append(callback)
        if add(ctypes.cast(callback, ctypes.c_void_p), None) != 0:
            _PENDING.remove(callback)
            return False
    except Exception:
        return False
    return True
