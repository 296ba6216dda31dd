"""``attach`` getting inside the training, and ``torchwatch detach PID``.

``attach`` injects :func:`torchwatch.hook.live.install` (on the training's main thread, see
:mod:`torchwatch.inject.injector`) unless ``--no-inject``, says in one line what happened
(the pause it caused, or why it watches from outside only and the fix), and on quitting
injects :func:`torchwatch.hook.live.detach` unless ``--keep-hook``. A training that already
has a hook (``torchwatch run``, ``torchwatch.hook.install()``) gets nothing injected: its hook
is read as it is, and left in place.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from torchwatch.inject.injector import Injector, Outcome, Payload
from torchwatch.model.errors import TorchwatchError

LIVE_MODULE = "torchwatch.hook.live"
# Imports first, in a thread of the training (not holding it), then the install on the held main thread.
PREPARE = Payload(module=LIVE_MODULE, function="prepare", thread=True)
INSTALL = Payload(module=LIVE_MODULE, function="install", thread=False)
DETACH = Payload(module=LIVE_MODULE, function="detach", thread=False)
OUTSIDE_ONLY = "no step times, data wait, DataLoader settings or bursts"


@dataclass(frozen=True)
class Injected:
    """What ``attach`` found or did inside the training.

    Attributes:
        pid: the process injected into (the training's main process).
        hooked: a hook is (or will be, once torch is imported) publishing in it.
        ours: torchwatch injected it now, so quitting attach takes it out.
        line: the one line said about it.
        pause_ms: how long the training's main thread was held (ms), ``None`` when not injected.
    """

    pid: int
    hooked: bool
    ours: bool
    line: str
    pause_ms: float | None = None
    method: str | None = None

    def report(self) -> dict[str, Any]:
        """The JSON report's ``injection`` key: ``injected`` (torchwatch put the hook in now),
        ``hooked`` (a hook publishes or will), ``method``, ``pause_ms``, ``reason`` (the line said)."""
        reason = self.line.removeprefix("torchwatch: ")
        return {
            "injected": self.ours,
            "hooked": self.hooked,
            "method": self.method,
            "pause_ms": None if self.pause_ms is None else round(self.pause_ms, 1),
            "reason": reason,
        }


def pause_ms(outcome: Outcome) -> float | None:
    """How long the target's main thread was held by an injection, ms.

    The ptrace path measures the longest stop (including the payload's run when it runs on the
    main thread); ``sys.remote_exec`` does not stop the process, so the payload's own run time
    on the main thread (``run_s`` in its result) is the pause.
    """
    if outcome.held_s is not None:
        return outcome.held_s * 1e3
    run_s = outcome.result.get("run_s")
    return float(run_s) * 1e3 if isinstance(run_s, (int, float)) else None


def _already_hooked(outcome: Outcome) -> str | None:
    """The evidence when injection was refused because the process has a hook already."""
    if outcome.plan is None:
        return None
    for f in outcome.plan.refusals:
        if f.check == "hook":
            return f.finding
    return None


def inject_hook(injector: Injector, pid: int) -> Injected:
    """Install the hook in ``pid`` (see the module docstring). Never raises; says what it did.

    Returns:
        An :class:`Injected`; its :attr:`~Injected.line` is already printed on stderr.
    """
    outcome = injector.inject(pid, PREPARE)
    if outcome.ok:
        outcome = injector.inject(pid, INSTALL)
    evidence = _already_hooked(outcome)
    value: dict[str, Any] = outcome.value if isinstance(outcome.value, dict) else {}
    if evidence is not None:
        found = Injected(pid, True, False, f"torchwatch: {evidence}: reading it, nothing injected")
    elif not outcome.ok:
        found = Injected(
            pid,
            False,
            False,
            f"torchwatch: watching PID {pid} from outside only ({OUTSIDE_ONLY}): {outcome.reason} "
            "(or attach with --no-inject to skip trying)",
        )
    elif value.get("already"):
        found = Injected(pid, True, False, f"torchwatch: PID {pid}: {value.get('reason')}")
    elif not value.get("installed"):
        why = value.get("reason")
        found = Injected(pid, False, False, f"torchwatch: watching PID {pid} from outside only ({OUTSIDE_ONLY}): {why}")
    else:
        held = pause_ms(outcome)
        held_text = "" if held is None else f"; the training was held {held:.0f} ms"
        when = "it activates when the training imports torch" if value.get("lazy") else "it measures from now on"
        signal_text = "" if value.get("signal_owned") or value.get("lazy") else " (bursts off: see the hook's errors)"
        found = Injected(
            pid,
            True,
            True,
            f"torchwatch: hook injected into PID {pid} through {outcome.method} in {outcome.wall_s * 1e3:.0f} ms"
            f"{held_text}: {when}{signal_text}; taken out when attach ends (--keep-hook leaves it)",
            held,
            outcome.method,
        )
    print(found.line, file=sys.stderr)
    return found


def detach_hook(injector: Injector, pid: int) -> tuple[bool, str, str | None]:
    """Take torchwatch's injected hook out of ``pid``. Never raises.

    Returns:
        ``(done, one line saying what happened, the fix when not done and the line lacks one)``.
    """
    outcome = injector.inject(pid, DETACH, into_hooked=True)
    value: dict[str, Any] = outcome.value if isinstance(outcome.value, dict) else {}
    if not outcome.ok:
        return False, f"cannot take the hook out of PID {pid}: {outcome.reason}", None
    if not value.get("detached"):
        hint = "only a hook that torchwatch attach injected can be taken out"
        return False, f"nothing taken out of PID {pid}: {value.get('reason')}", hint
    held = pause_ms(outcome)
    left = [str(x) for x in value.get("left") or []]
    text = f"hook taken out of PID {pid}"
    if held is not None:
        text += f" (the training was held {held:.0f} ms)"
    if left:
        text += "; left as the training changed them: " + "; ".join(left)
    return True, text, None


def detach_command(pid_text: str) -> int:
    """``torchwatch detach PID``: exit 0 when the hook was taken out.

    Raises:
        TorchwatchError: the PID is malformed, or nothing could be taken out (one line, with why).
    """
    from torchwatch.watch.target import parse_pid

    pid = parse_pid(pid_text)
    with Injector() as injector:
        done, line, hint = detach_hook(injector, pid)
    if not done:
        raise TorchwatchError(line, hint)
    print(f"torchwatch: {line}", file=sys.stderr)
    return 0
