"""Run an entry point of torchwatch's own code inside a live Python process: :func:`inject`.

- Python 3.14+, when torchwatch runs on the same version: ``sys.remote_exec`` (PEP 768). The
  target runs the script at its next safe point (between bytecodes, on the main thread); no
  ptrace stop.
- Python 3.10-3.13 (and 3.14+ from another version): hypno's library loaded with pyinjector
  in a helper process (:mod:`torchwatch.inject._ptrace`), at a moment when the target's main
  thread is stopped somewhere safe.

Before anything, :func:`torchwatch.inject.checks.evaluate` must allow it; a refusal comes
back as a one-line reason with its fix. The files the target needs are in a fresh directory
torchwatch creates (``torchwatch-inject-*`` in the temporary directory, mode 0711, owned by
torchwatch): the library or script (0644 when the target is another user, else 0600) and
``out/``, the only place the target writes, made 0700 and handed to the target's user with
``fchown`` on the descriptor torchwatch created it with. The result is read back without
following links, size-capped, schema- and token-checked, and the directory is removed
afterwards (only the names torchwatch expects; an ``out/`` the target filled with anything
else is left).

Risks of the ptrace path (kubo/injector's README and source, hypno's source) and how the
helper meets them: a signal that reaches the target's main thread while pyinjector runs code
on it makes pyinjector give up half way, so every signal is blocked on that thread for the
attach and put back after (:class:`torchwatch.inject._ptrace.BlockedSignals`); a thread stopped
inside ``malloc``, a lock wait or the GIL's hand-over would deadlock, so only waits the
interpreter makes outside its locks and code outside the C library and the interpreter count as
safe moments (:func:`torchwatch.inject._ptrace.classify`); the vector registers the injected
code uses are put back by the helper, not by pyinjector; and an injected call that does not
return in time (the GIL held elsewhere) is left to finish, never cut off (:class:`_Helper`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchwatch import wire
from torchwatch.inject import checks, facts, payload
from torchwatch.inject.checks import Method, Plan
from torchwatch.inject.facts import Host, Target

HELPER = Path(__file__).with_name("_ptrace.py")
SAFE_POINT_WINDOW_S = 5.0
"""How long the ptrace path looks for a safe moment (s). On a quiet machine the first or second
stop is one (docs/attach.md); 2 s missed once under load ~10, where a training that sleeps 10 ms
between steps was caught in the interpreter or libtorch at each of 112 stops."""
DETACH_WINDOW_S = 8.0
"""The window to take a hook out (s): longer, since a detach that fails leaves the hook in."""
DETACH_TIMEOUT_S = 15.0
"""The detach's whole time (s): its window and the payload's run after it."""
HELPER_START_TIMEOUT_S = 60.0
"""How long the ptrace helper may take to start and import pyinjector (s), before the first
injection's own clock starts: ~0.05 s on a quiet machine; generous, since a start that is only
slow (a busy machine, a cold disk) is no reason to give up, and nothing is held meanwhile."""
_LIBRARY = "payload.so"
_SCRIPT = "payload.py"
_OUT = "out"


@dataclass(frozen=True)
class Payload:
    """What to run in the target: ``module.function()``, imported from ``path``.

    Attributes:
        module: e.g. ``"torchwatch.inject.probe"``; its package must import with the standard
            library alone when the target lacks torchwatch's dependencies.
        function: called with no argument; its return value (JSON-serialisable; ``str()``
            otherwise) comes back in :attr:`Outcome.value`.
        thread: run it in a new thread of the target (the default: the main thread is held
            only to start it) or, ``False``, on the main thread while it is held.
        path: the directory holding the torchwatch package the module is loaded from, by path
            (:func:`torchwatch.wire.bypath.load`); default
            torchwatch's own install (:attr:`Host.package_root`).
    """

    module: str = "torchwatch.inject.probe"
    function: str = "run"
    thread: bool = True
    path: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What an injection did.

    Attributes:
        ok: the entry point ran and returned.
        reason: one line, with the fix when there is one; ``""`` when ok.
        method: ``remote_exec``, ``ptrace`` or ``None`` (refused before trying).
        value: the entry point's return value.
        plan: the checks made before trying.
        wall_s: seconds from the call to the result, in torchwatch.
        held_s: longest ptrace stop of the target's main thread (s), including the payload's
            run on it when ``thread=False``; ``None`` for ``remote_exec`` or when not tried.
        tries: ptrace stops needed to find a safe moment.
        result: the target's ``result.json`` (``pid``, ``python``, ``module_file``,
            ``main_thread``, ``run_s``, ...), ``{}`` when none came back.
    """

    ok: bool
    reason: str
    method: Method | None = None
    value: Any = None
    plan: Plan | None = None
    wall_s: float = 0.0
    held_s: float | None = None
    tries: int | None = None
    result: dict[str, Any] = field(default_factory=dict)


class _Workdir:
    """The fresh directory holding the library or script and the target's ``out/``.

    Everything is made and checked through descriptors of directories this process created,
    so a name swapped underneath by the target's user cannot redirect a write, chmod or chown.
    """

    def __init__(self, target_uid: int, target_gid: int, reachable: str, root: str | None = None) -> None:
        self.parent_fd: int | None = None
        if root is None:
            self.path = Path(tempfile.mkdtemp(prefix="torchwatch-inject-", dir=reachable))
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        else:
            # In the target's own /tmp, reached through its root without following a link out of it;
            # self.path is the target's name for it (what the injected code opens).
            self.parent_fd = wire.open_dir_in(root, reachable, (0, target_uid), private=False)
            name = f"torchwatch-inject-{secrets.token_hex(8)}"
            os.mkdir(name, 0o700, dir_fd=self.parent_fd)
            self.fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.parent_fd)
            self.path = Path(reachable) / name
        self.other_user = target_uid != os.geteuid()
        if self.other_user:
            os.fchmod(self.fd, 0o711)  # the target may reach its files by name, not list or change them
        os.mkdir(_OUT, 0o700, dir_fd=self.fd)
        self.out_fd = os.open(_OUT, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd)
        if self.other_user:
            os.fchown(self.out_fd, target_uid, target_gid)
        self.uid = target_uid

    @property
    def out(self) -> Path:
        """The directory the target writes its result into."""
        return self.path / _OUT

    def write(self, name: str, data: bytes) -> Path:
        """Create ``name`` (exclusively, 0644 for another user, else 0600) with ``data``."""
        mode = 0o644 if self.other_user else 0o600
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=self.fd)
        try:
            os.fchmod(fd, mode)  # whatever the umask
            os.write(fd, data)
        finally:
            os.close(fd)
        return self.path / name

    def read_result(self) -> dict[str, Any] | None:
        """``out/result.json`` if it is a regular file of the target's user, at most 64 KiB, a JSON object."""
        try:
            fd = os.open(payload.RESULT_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.out_fd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != self.uid or st.st_size > payload.MAX_RESULT_BYTES:
                return None
            data = os.read(fd, payload.MAX_RESULT_BYTES + 1)
        finally:
            os.close(fd)
        try:
            parsed = json.loads(data)
        except (ValueError, RecursionError):
            return None
        return parsed if isinstance(parsed, dict) else None

    def close(self) -> None:
        """Remove what torchwatch and the payload put there; leave anything else."""
        with contextlib.suppress(OSError):
            for name in os.listdir(self.out_fd):
                if name == payload.RESULT_FILE or (name.startswith(".result-") and name.endswith(".tmp")):
                    os.unlink(name, dir_fd=self.out_fd)
        for name in (_LIBRARY, _SCRIPT):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)
        with contextlib.suppress(OSError):
            os.rmdir(_OUT, dir_fd=self.fd)
        os.close(self.out_fd)
        os.close(self.fd)
        with contextlib.suppress(OSError):
            if self.parent_fd is None:
                self.path.rmdir()
            else:
                os.rmdir(self.path.name, dir_fd=self.parent_fd)
        if self.parent_fd is not None:
            os.close(self.parent_fd)


def _reachable_tmp(uid: int, gids: list[int]) -> str:
    """A temporary directory the target's user can traverse (``$TMPDIR`` first, then /tmp, /dev/shm)."""
    for candidate in (tempfile.gettempdir(), "/tmp", "/dev/shm"):
        if os.path.isdir(candidate) and checks.readable_by(candidate, uid, gids) is None:
            return candidate
    return "/tmp"


@contextlib.contextmanager
def _workdir(target: Target, view: facts.View) -> Iterator[_Workdir]:
    uid = target.uids[1] if target.uids else os.geteuid()
    gid = target.gids[1] if target.gids else os.getegid()
    if view.root is not None and view.shared_tmp is None and view.own_tmp is not None:
        work = _Workdir(uid, gid, view.own_tmp, view.root)
    else:
        work = _Workdir(uid, gid, view.shared_tmp or _reachable_tmp(uid, [gid, *target.groups]))
    try:
        yield work
    finally:
        work.close()


def _wait_result(work: _Workdir, token: str, deadline: float) -> dict[str, Any] | None:
    while True:
        found = work.read_result()
        if found is not None and found.get("token") == token and found.get("schema") == payload.SCHEMA:
            return found
        if time.time() > deadline:
            return None
        time.sleep(0.01)


def _remote_exec(pid: int, script: Path) -> str | None:
    run = getattr(sys, "remote_exec", None)
    if run is None:
        return "sys.remote_exec is missing from this Python"
    try:
        run(pid, str(script))
    except (OSError, RuntimeError, ValueError) as exc:
        return f"sys.remote_exec failed: {exc}"
    return None


_LEFT_TO_FINISH: list[subprocess.Popen[str]] = []  # helpers still inside an injected call: never killed


class _Helper:
    """The ptrace helper process (:mod:`torchwatch.inject._ptrace`), started once and reused.

    A helper whose answer does not come in time is inside an injected call that has not
    returned: the target's main thread runs torchwatch's code and waits (for the GIL held by
    another thread in C code, say). Killing the helper then would leave the target with
    pyinjector's registers and trap in place (a training stuck for good, ``trap int3`` in the
    kernel log). So it is left to finish: its input is closed, it ends by itself once the call
    returns and the target's registers are back, and this helper takes no more requests.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.stuck: str | None = None

    def start(self, timeout_s: float = HELPER_START_TIMEOUT_S) -> str | None:
        """Start it if it is not running and wait up to ``timeout_s`` for its ready line, so
        that its start-up never counts against an injection's time; the reason when it cannot
        be started (then nothing was held)."""
        if self.stuck is not None:
            return self.stuck
        if self.proc is not None and self.proc.poll() is None:
            return None
        self.proc = None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", str(HELPER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
        except OSError as exc:
            return f"cannot start the injector: {exc.strerror or exc}"
        assert proc.stdout is not None
        try:
            ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
            line = proc.stdout.readline() if ready else ""
        except (OSError, ValueError):
            line = ""
        try:
            answer = json.loads(line) if line else None
        except ValueError:
            answer = None
        if not (isinstance(answer, dict) and answer.get("ready") is True):
            self.proc = proc
            self.close()
            if not ready:
                return f"the injector did not start within {timeout_s:g} s (is the machine overloaded?)"
            return f"the injector stopped as it started (exit status {proc.poll()})"
        self.proc = proc
        return None

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and wait up to ``timeout_s`` for its answer."""
        if self.stuck is not None:
            return {"ok": False, "error": self.stuck}
        why = self.start()
        if why:
            return {"ok": False, "error": why}
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
            line = proc.stdout.readline() if ready else ""
        except (OSError, ValueError) as exc:
            self.close()
            return {"ok": False, "error": f"the injector failed: {exc}"}
        if not ready:
            pid = request["pid"]
            why = (
                f"its main thread is still in the injected call (waiting for the GIL or a lock, see py-spy dump "
                f"--pid {pid}); torchwatch lets it finish rather than stop it half way, and injects nothing more "
                "this run"
            )
            self.stuck = f"an earlier injection into PID {pid} has not returned: {why}"
            self._leave_to_finish()
            return {"ok": False, "error": f"the injection into PID {pid} did not return within {timeout_s:g} s: {why}"}
        try:
            answer = json.loads(line)
        except ValueError:
            self.close()
            return {"ok": False, "error": f"the injector stopped (exit status {proc.poll()})"}
        return answer if isinstance(answer, dict) else {"ok": False, "error": "the injector answered nonsense"}

    def _end_input(self) -> subprocess.Popen[str] | None:
        """Take the helper out of service and close its input (it ends after the call in progress)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(OSError, ValueError):
                if proc.stdin is not None:
                    proc.stdin.close()
        return proc

    def _leave_to_finish(self) -> None:
        """Close the helper's input and never kill it."""
        proc = self._end_input()
        if proc is not None:
            _LEFT_TO_FINISH.append(proc)

    def close(self) -> None:
        """Stop it (closing its stdin ends it; killed if it does not end within 1 s)."""
        proc = self._end_input()
        if proc is None:
            return
        try:
            proc.wait(1.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


class Injector:
    """Injects into processes; holds the ptrace helper between calls. A context manager.

    ``attach`` keeps one for its whole run, so the helper's start-up happens once, before any
    training is held; :func:`inject` makes one for a single call.

    Args:
        proc: the ``/proc`` to read facts from.
        host: torchwatch's own facts; default :func:`~torchwatch.inject.facts.read_host`.
    """

    def __init__(self, proc: Path = facts.PROC, host: Host | None = None) -> None:
        self.proc = proc
        self.host = host
        self._helper = _Helper()

    def __enter__(self) -> Injector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def warm_up(self) -> None:
        """Start the ptrace helper now (otherwise at the first ptrace injection)."""
        if checks.injector_missing() is None:
            self._helper.start()

    def close(self) -> None:
        """Stop the helper. Idempotent."""
        self._helper.close()

    def inject(
        self,
        pid: int,
        what: Payload | None = None,
        *,
        timeout_s: float = 10.0,
        window_s: float = SAFE_POINT_WINDOW_S,
        into_hooked: bool = False,
    ) -> Outcome:
        """Run ``what`` inside process ``pid`` and return what it reported. Never raises for the
        target's sake: every failure is an :class:`Outcome` with ``ok=False`` and a reason.

        Args:
            pid: the target.
            what: the entry point; default the probe (:mod:`torchwatch.inject.probe`).
            timeout_s: give up after this many seconds (then the payload, if it runs late, does nothing).
            window_s: how long the ptrace path looks for a safe moment to stop the main thread.
            into_hooked: inject even though the process has a torchwatch hook (to take out the
                hook ``attach`` injected); otherwise that is a refusal.

        Returns:
            An :class:`Outcome`.
        """
        return self._inject(pid, what or Payload(), timeout_s, window_s, into_hooked)

    def _inject(self, pid: int, what: Payload, timeout_s: float, window_s: float, into_hooked: bool) -> Outcome:
        started = time.monotonic()
        try:
            target = facts.read_target(pid, self.proc)
        except facts.NoSuchTarget:
            return Outcome(False, f"no process with PID {pid} (check it with: pgrep -af python)")
        host = self.host or facts.read_host(self.proc)
        hooked = (lambda _target: None) if into_hooked else checks.hook_evidence
        view = facts.read_view(pid, host.package_root, target.uids[1] if target.uids else None)
        plan = checks.evaluate(host, target, missing_injector=checks.injector_missing(), hooked=hooked, view=view)
        if plan.method is None:
            return Outcome(False, f"cannot inject into PID {pid}: {plan.reason()}", plan=plan)
        if plan.method != "remote_exec":
            # the helper's start-up (a new interpreter, pyinjector's import) is not the injection's time
            why = self._helper.start()
            if why:
                return Outcome(False, why, plan.method, plan=plan)
        token = secrets.token_hex(16)
        with _workdir(target, view) as work:
            params: dict[str, Any] = {
                "out": str(work.out),
                "token": token,
                "deadline": time.time() + timeout_s,
                "module": what.module,
                "function": what.function,
                "path": what.path or host.package_root,
                "thread": what.thread,
            }
            code = payload.source(params)
            held: float | None = None
            tries: int | None = None
            if plan.method == "remote_exec":
                error = _remote_exec(pid, work.write(_SCRIPT, code.encode()))
            else:
                from torchwatch.inject._ptrace import library_with_code

                try:
                    library = work.write(_LIBRARY, library_with_code(code.encode()))
                except (OSError, ValueError) as exc:
                    return Outcome(False, f"cannot prepare the injection: {exc}", plan.method, plan=plan)
                request = {
                    "pid": pid,
                    "start_ticks": target.start_ticks,
                    "library": str(library),
                    "window_s": window_s,
                }
                answer = self._helper.ask(request, timeout_s)
                error = None if answer.get("ok") else str(answer.get("error") or "the injector failed")
                held = answer.get("held_s")
                tries = answer.get("tries")
            if error:
                return Outcome(False, error, plan.method, plan=plan, held_s=held, tries=tries)
            result = _wait_result(work, token, params["deadline"])
        wall = time.monotonic() - started
        if result is None:
            return Outcome(
                False,
                f"PID {pid} did not report back within {timeout_s:g} s (its main thread may be blocked in C code)",
                plan.method,
                plan=plan,
                wall_s=wall,
                held_s=held,
                tries=tries,
            )
        if not result.get("ok"):
            reason = f"the injected code failed in PID {pid} and was undone: {str(result.get('error'))[:300]}"
            return Outcome(False, reason, plan.method, plan=plan, wall_s=wall, held_s=held, tries=tries, result=result)
        return Outcome(True, "", plan.method, result.get("value"), plan, wall, held, tries, result)


def inject(pid: int, what: Payload | None = None, *, timeout_s: float = 10.0) -> Outcome:
    """One injection with a fresh :class:`Injector` (see :meth:`Injector.inject`)."""
    with Injector() as injector:
        return injector.inject(pid, what, timeout_s=timeout_s)
