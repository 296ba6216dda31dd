"""Running a live trial of a setting on a hooked training or job, from torchwatch's side.

torchwatch plans the blocks from the step time it reads, writes the same request to every rank's
hook (the same ``id`` and, for several ranks, the same ``start_step``, so every rank switches at
the same step), sends the burst signal, then reads each rank's published
:class:`~torchwatch.wire.TrialState` until all have ended. The hook runs the trial and
puts the old value back by itself; torchwatch only asks. When torchwatch is stopped (SIGTERM,
SIGINT, SIGHUP) while a trial runs, it asks every rank to end the trial (``trial-stop``) and waits
for their old values to be read back, at most :data:`STOP_WAIT_S`, before it goes.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence

from torchwatch import wire
from torchwatch.model.errors import TorchwatchError, UsageError
from torchwatch.model.trials import Outcome, Plan
from torchwatch.sources.hook import HookReader, running_no_hook_hint
from torchwatch.watch.job import find_job

__all__ = ["BLOCK_S", "STOP_WAIT_S", "check_assignment", "plan_trial", "readers_for", "run_trial"]

BLOCK_S = 2.0  # a block's length, s: long enough that a block's mean steadies, short enough for 8+ in 60 s
STOP_WAIT_S = 5.0  # after a stop signal: how long torchwatch waits for the old values to be read back
START_MARGIN_STEPS = 3  # several ranks start at least this many steps after the furthest one
START_MARGIN_S = 1.0
"""...and at least this long after it, s, at the typical step: the request reaches each rank by a
signal whose Python handler runs only between bytecodes of the main thread (after the collective
or C call it is in returns), and the ranks are signalled one after another. 3 steps alone were
85 ms at a 2-rank gloo job's 28 ms steps, and on a loaded 2-core machine one rank read the request
a step after the start step: it then switched a step later than the other."""
POLL_S = 0.2


def readers_for(pid: int) -> list[HookReader]:
    """The hook readers of ``pid``: every rank when it is a rank or the launcher of a job
    (the same trial on all of them), else ``pid`` alone.

    Raises:
        TorchwatchError: no process has a hook.
    """
    job = find_job(pid)
    pids = [m.pid for m in job.ranks] if job.is_job else [pid]
    readers = [HookReader(p) for p in pids]
    hooked = [r for r in readers if r.record() is not None]
    if not hooked:
        reason = readers[0].reason or f"no hook in PID {pid}"
        raise TorchwatchError(f"no trial: {reason}", running_no_hook_hint(pid))
    return hooked


def _usable_cpus(reader: HookReader) -> float | None:
    """The usable CPUs the hook of ``reader`` published (``None``: not read)."""
    rec = reader.record()
    return None if rec is None else rec.usable_cpus


def _typical_step(readers: Sequence[HookReader]) -> tuple[float | None, int]:
    """The median of the last 20 steps' durations over the readers, s, and the furthest step count."""
    durations: list[float] = []
    furthest = 0
    for reader in readers:
        snap = reader.counters()
        if snap is None:
            continue
        furthest = max(furthest, snap.steps)
        durations += [e[1] for e in snap.entries[-20:] if e[1] > 0]
    if not durations:
        return None, furthest
    durations.sort()
    return durations[len(durations) // 2], furthest


_HINTS = {
    "syntax": "e.g. threads=2 or num_workers=4; torchwatch trial --help lists them",
    "refused": "change it in the script",
    "numerics": "add --allow-numerics to try it anyway",
    "cpus": "try a value within the usable CPUs (torchwatch doctor PID shows them)",
}


def check_assignment(
    assignment: str, *, block_steps: int | None = None, max_s: float = 60.0, allow_numerics: bool = False
) -> wire.Assignment:
    """``assignment`` (``SETTING=VALUE``) parsed and checked (:func:`wire.check_trial`, the
    check the hook makes too) before anything is read or sent; :func:`plan_trial` takes the result.

    Raises:
        UsageError: not ``SETTING=VALUE``, an unknown setting or value, a setting never tried live,
            a precision setting without ``allow_numerics``, ``block_steps`` or ``max_s`` out of range.
    """
    try:
        checked = wire.check_trial(assignment, allow_numerics=allow_numerics)
    except wire.NotTried as exc:
        raise UsageError(str(exc), _HINTS[exc.why]) from None
    _check_bounds(block_steps, max_s)
    return checked


def _check_bounds(block_steps: int | None, max_s: float) -> None:
    """Raises: UsageError (``max_s`` not 5 to 600 s, ``block_steps`` not 2 to 1000)."""
    if not 5 <= max_s <= 600:
        raise UsageError(f"--max-s must be 5 to 600, not {max_s:g}", "a trial is bounded")
    if block_steps is not None and not 2 <= block_steps <= 1000:
        raise UsageError(f"--steps must be 2 to 1000, not {block_steps}", "steps per block")


def plan_trial(
    readers: Sequence[HookReader],
    assignment: str | wire.Assignment,
    *,
    block_steps: int | None = None,
    max_s: float = 60.0,
    keep: bool = False,
    allow_numerics: bool = False,
    target: float = 0.05,
    rng: random.Random | None = None,
) -> Plan:
    """The request for ``assignment`` (``SETTING=VALUE``, or what :func:`check_assignment`
    returned for it with the same ``allow_numerics``: it is not parsed again) on the processes
    of ``readers``.

    Blocks last about :data:`BLOCK_S` s (from the median step), at least 5 steps; a fifth of
    each, 1 to 5 steps, is dropped after each switch. Several ranks start
    :data:`START_MARGIN_STEPS` and :data:`START_MARGIN_S` after the furthest rank's step.

    Raises:
        UsageError: not ``SETTING=VALUE``, an unknown setting or value, a precision setting
            without ``allow_numerics``, a setting never tried live, bad ``block_steps``/``max_s``,
            ``threads`` or ``num_workers`` beyond what the training's usable CPUs carry
            (:func:`wire.cpu_bound`, the fewest CPUs of the ranks).
        TorchwatchError: no step measured yet (steps mode: blocks cannot be planned).
    """
    if isinstance(assignment, wire.Assignment):
        checked = assignment
        _check_bounds(block_steps, max_s)
    else:
        checked = check_assignment(assignment, block_steps=block_steps, max_s=max_s, allow_numerics=allow_numerics)
    setting, text = checked.setting, checked.text
    cpus = [c for c in (_usable_cpus(r) for r in readers) if c is not None]
    why = wire.check_cpu_bound(setting, checked.value, min(cpus) if cpus else None)
    if why is not None:
        raise UsageError(why, _HINTS["cpus"])
    typical, furthest = _typical_step(readers)
    if block_steps is None:
        if typical is None:
            if setting.mode == wire.STEPS:
                raise TorchwatchError("no step measured yet: blocks cannot be planned", "try again in a few steps")
            block_steps = 10
        else:
            block_steps = max(5, min(1000, math.ceil(BLOCK_S / typical)))
    warmup = max(1, min(5, block_steps // 5))
    margin = START_MARGIN_STEPS if typical is None else max(START_MARGIN_STEPS, math.ceil(START_MARGIN_S / typical))
    start = furthest + margin if len(readers) > 1 and setting.mode == wire.STEPS else None
    rid = (rng or random.SystemRandom()).randint(1, 1 << 31)
    req = wire.TrialRequest(
        id=rid, setting=setting.name, value=text, block_steps=block_steps, warmup=warmup, max_s=max_s,
        target=target, keep=keep, allow_numerics=allow_numerics, start_step=start,
    )  # fmt: skip
    return Plan(req, typical)


def run_trial(
    readers: Sequence[HookReader],
    plan: Plan,
    *,
    stopped: Callable[[], int | None] = lambda: None,
    on_progress: Callable[[dict[int, wire.TrialState | None]], None] | None = None,
    wait_extra_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Send ``plan`` to every reader's hook and wait until every rank's trial ended.

    Args:
        stopped: returns the stop signal torchwatch received, or ``None``; when set, the trial is
            ended on every rank (``trial-stop``) and their states read for :data:`STOP_WAIT_S`.
        on_progress: called after each poll with the states so far.
        wait_extra_s: seconds past the request's ``max_s`` to wait for the hooks' last states.

    Raises:
        TorchwatchError: the request could be sent to no process.
    """
    out = Outcome(plan)
    for reader in readers:
        sent, message = reader.request_trial(plan.request)
        if not sent:
            out.not_sent[reader.pid] = message
        else:
            out.states[reader.pid] = None
    if not out.states:
        reasons = "; ".join(f"PID {p}: {m}" for p, m in out.not_sent.items())
        raise TorchwatchError(f"no trial: {reasons}", "start the training with torchwatch run, or attach to it")
    live = {r.pid: r for r in readers if r.pid in out.states}
    deadline = time.monotonic() + plan.request.max_s + wait_extra_s
    stop_deadline: float | None = None
    while live:
        for pid, reader in list(live.items()):
            rec = reader.record()
            if rec is None:
                out.exited.append(pid)
                del live[pid]
                continue
            if rec.rank is not None and rec.rank.rank is not None:
                out.ranks[pid] = rec.rank.rank
            st = rec.trial
            if not (isinstance(st, wire.TrialState) and st.id == plan.request.id):
                st = rec.trial_refused  # refused while another trial ran there
            if isinstance(st, wire.TrialState) and st.id == plan.request.id:
                out.states[pid] = st
                if st.finished:
                    del live[pid]
        if on_progress is not None:
            on_progress(dict(out.states))
        if not live:
            break
        now = time.monotonic()
        signum = stopped()
        if signum is not None and stop_deadline is None:
            out.stopped_by = signum
            stop = wire.TrialStop(plan.request.id)
            for reader in live.values():
                reader.request_trial(stop)
            stop_deadline = now + STOP_WAIT_S
        if (stop_deadline is not None and now >= stop_deadline) or now >= deadline:
            break
        sleep(POLL_S)
    return out
