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
import time
from dataclasses import dataclass
from typing import Any

from torchwatch.inject.injector import DETACH_TIMEOUT_S, DETACH_WINDOW_S, Injector, Outcome, Payload
from torchwatch.model.errors import TorchwatchError
from torchwatch.watch.job import Job

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


RAN_CHECK_S = 0.5
_BOOLS = ("installed", "already", "active", "lazy", "signal_owned", "detached", "gone", "prepared", "torch")
_TEXTS = ("reason", "dir")
_LISTS = ("left", "errors")
MAX_ANSWER_ITEMS = 64  # lines of "left"/"errors" kept from an answer


def checked_answer(outcome: Outcome) -> tuple[dict[str, Any], str | None]:
    """The injected call's answer, checked against what :mod:`torchwatch.hook.live` returns:
    booleans, texts (cut to one short line each) and lists of texts. The answer comes from
    inside the training, whose own ``sys.path`` may hold a module of that name (a planted
    ``torchwatch/hook/live.py``): a wrong type is never used.

    Returns:
        ``(the answer, None)``, or ``({}, why it is not the hook's)``.
    """
    from torchwatch.wire import TEXT, clean_text

    value = outcome.value
    if value is None:
        return {}, None
    if not isinstance(value, dict):
        return {}, f"its answer is a {type(value).__name__}, not the hook's object"
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in _BOOLS and not isinstance(item, bool):
            return {}, f"its answer's {key!r} is a {type(item).__name__}, not true or false"
        if key in _TEXTS and not isinstance(item, str):
            return {}, f"its answer's {key!r} is a {type(item).__name__}, not a text"
        if key in _LISTS and not (isinstance(item, list) and all(isinstance(x, str) for x in item)):
            return {}, f"its answer's {key!r} is not a list of texts"
        if key in _TEXTS:
            item = clean_text(item, TEXT)
        elif key in _LISTS:
            item = [clean_text(x, TEXT) for x in item[:MAX_ANSWER_ITEMS]]
        out[key] = item
    return out, None


def _not_ours(pid: int, why: str) -> str:
    return (
        f"refused: PID {pid} answered with what torchwatch's hook never returns ({why}): a module of its own "
        "named torchwatch.hook.live on the training's path?"
    )


def _main_thread_counters(pid: int) -> tuple[int, int]:
    """``pid``'s main thread: nanoseconds on a CPU (schedstat) and context switches so far.

    Raises:
        OSError, ValueError, IndexError: the files are gone or unreadable.
    """
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        ran = int(f.read().split()[0])
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        switches = sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
    return ran, switches


def _runs_after_failure(pid: int) -> str:
    """After an injection that was tried and failed: whether the training's main thread ran at all
    in the next :data:`RAN_CHECK_S` s (on a CPU, or woke up), as ``"; ..."`` to add to the line."""
    try:
        before = _main_thread_counters(pid)
        time.sleep(RAN_CHECK_S)
        after = _main_thread_counters(pid)
    except (OSError, ValueError, IndexError):
        return f"; PID {pid} is gone or no longer readable"
    if after != before:
        return f"; its main thread runs on ({RAN_CHECK_S:g} s checked)"
    return (
        f"; its main thread has not run in the {RAN_CHECK_S:g} s since: it may be waiting, or stuck "
        f"(see py-spy dump --pid {pid})"
    )


def inject_hook(injector: Injector, pid: int) -> Injected:
    """Install the hook in ``pid`` (see the module docstring). Never raises; says what it did.

    Returns:
        An :class:`Injected`; its :attr:`~Injected.line` is already printed on stderr.
    """
    outcome = injector.inject(pid, PREPARE)
    if outcome.ok:
        outcome = injector.inject(pid, INSTALL)
    evidence = _already_hooked(outcome)
    value, bad = checked_answer(outcome)
    if bad is not None and outcome.ok:
        found = Injected(pid, False, False, f"torchwatch: watching PID {pid} from outside only ({OUTSIDE_ONLY}): "
                         + _not_ours(pid, bad))  # fmt: skip
    elif evidence is not None:
        found = Injected(pid, True, False, f"torchwatch: {evidence}: reading it, nothing injected")
    elif not outcome.ok:
        runs = "" if outcome.method is None else _runs_after_failure(pid)
        found = Injected(
            pid,
            False,
            False,
            f"torchwatch: watching PID {pid} from outside only ({OUTSIDE_ONLY}): {outcome.reason}{runs} "
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


def inject_job(injector: Injector, job: Job) -> list[Injected]:
    """Install the hook in every rank of ``job`` (never in its launcher), one after the other, each
    as :func:`inject_hook` does (its line printed); then one line saying which ranks have a hook.
    A rank that exited or whose PID now names another process is skipped, and said. Never raises."""
    done: list[Injected] = []
    for member in job.ranks:
        if not member.alive():
            done.append(
                Injected(member.pid, False, False, f"torchwatch: PID {member.pid} exited before attach reached it")
            )
            print(done[-1].line, file=sys.stderr)
            continue
        done.append(inject_hook(injector, member.pid))
    hooked = [str(d.pid) for d in done if d.hooked]
    without = [f"PID {d.pid}" for d in done if not d.hooked]
    line = f"torchwatch: hook in {len(hooked)} of {len(done)} ranks" + (
        f" (PIDs {', '.join(hooked)})" if hooked else ""
    )
    if without:
        line += f"; none in {', '.join(without)} (its line above says why)"
    print(line, file=sys.stderr)
    return done


def job_report(job: Job, injected: list[Injected], tried: bool = True) -> dict[str, Any]:
    """The JSON report's ``injection`` for a job: the keys of :meth:`Injected.report` over all ranks
    (``injected``/``hooked``: any rank; ``pause_ms``: the longest hold), ``ranks`` (each rank's
    own, with ``pid``) and ``job`` (:meth:`torchwatch.watch.job.Job.report`); ``tried``: false
    under ``--no-inject`` (then ``reason`` says so and ``ranks`` is empty)."""
    each = [{"pid": d.pid, **d.report()} for d in injected]
    pauses = [d.pause_ms for d in injected if d.pause_ms is not None]
    methods = sorted({d.method for d in injected if d.method})
    hooked = sum(d.hooked for d in injected)
    return {
        "injected": any(d.ours for d in injected),
        "hooked": hooked > 0,
        "method": methods[0] if methods else None,  # one interpreter version, one method
        "pause_ms": round(max(pauses), 1) if pauses else None,
        "reason": f"hook in {hooked} of {len(injected)} ranks of the job" if tried else "--no-inject: nothing injected",
        "ranks": each,
        "job": job.report(),
    }


def detach_hook(injector: Injector, pid: int) -> tuple[bool, str, str | None]:
    """Take torchwatch's injected hook out of ``pid``. Never raises.

    Returns:
        ``(done, one line saying what happened, the fix when not done and the line lacks one)``.
    """
    outcome = injector.inject(pid, DETACH, into_hooked=True, window_s=DETACH_WINDOW_S, timeout_s=DETACH_TIMEOUT_S)
    value, bad = checked_answer(outcome)
    if not outcome.ok:
        return False, f"cannot take the hook out of PID {pid}: {outcome.reason}", None
    if bad is not None:
        return False, _not_ours(pid, bad), "take it out by ending the training, or remove that module"
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
        TorchwatchError: the PID is malformed, ``/proc`` is another PID namespace's, or nothing
            could be taken out (one line, with why).
    """
    from torchwatch.watch.target import check_proc_namespace, parse_pid

    pid = parse_pid(pid_text)
    check_proc_namespace()
    with Injector() as injector:
        done, line, hint = detach_hook(injector, pid)
    if not done:
        raise TorchwatchError(line, hint)
    print(f"torchwatch: {line}", file=sys.stderr)
    return 0
