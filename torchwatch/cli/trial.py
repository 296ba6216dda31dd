"""``torchwatch trial PID SETTING=VALUE``: try a setting on a running training, live, and put it back."""

from __future__ import annotations

import sys
from collections.abc import Callable

from torchwatch import wire
from torchwatch.cli.burst import emit_result
from torchwatch.faces import report
from torchwatch.faces.trial import block_lines, outcome_lines
from torchwatch.model.trials import Outcome
from torchwatch.watch.target import check_attachable, parse_pid
from torchwatch.watch.trials import check_assignment, plan_trial, readers_for, run_trial


def trial_command(
    pid_text: str,
    assignment: str,
    *,
    steps: int | None,
    max_s: float,
    keep: bool,
    allow_numerics: bool,
    json_path: str | None,
    stopped: Callable[[], int | None] = lambda: None,
) -> int:
    """Run one trial and print its result. Returns 0 when it measured a result, 1 otherwise.

    Raises:
        UsageError: bad PID, setting, value or bounds.
        TorchwatchError: no such process, no hook, nothing could be sent.
    """
    pid = parse_pid(pid_text)
    checked = check_assignment(assignment, block_steps=steps, max_s=max_s, allow_numerics=allow_numerics)
    report.check_json_path(json_path)
    check_attachable(pid)
    readers = readers_for(pid)
    plan = plan_trial(readers, checked, block_steps=steps, max_s=max_s, keep=keep, allow_numerics=allow_numerics)
    req = plan.request
    setting = wire.find_setting(req.setting)
    assert setting is not None
    if setting.mode == wire.STEPS:
        how = f"blocks of {req.block_steps} steps ({req.warmup} dropped after each switch)"
    else:
        how = "one epoch per block (a DataLoader setting takes effect at a new iterator)"
    who = f"PID {readers[0].pid}" if len(readers) == 1 else f"{len(readers)} ranks (from step {req.start_step})"
    print(
        f"torchwatch: trying {req.setting}={req.value} on {who}: {how}, on/off/off/on..., at most {req.max_s:g} s; "
        "the training's value is put back at the end" + (" unless it is faster (--keep)" if keep else ""),
        file=sys.stderr,
        flush=True,
    )
    shown = [0]
    first = readers[0].pid

    def progress(states: dict[int, wire.TrialState | None]) -> None:
        st = states.get(first)
        if st is None:
            return
        for line in block_lines(st.blocks)[shown[0] :]:
            print(line, file=sys.stderr, flush=True)
        shown[0] = len(st.blocks)

    out = run_trial(readers, plan, stopped=stopped, on_progress=progress)
    emit_result("\n".join(outcome_lines(out)), out.to_json(), json_path, pid, "trial")
    return 0 if _measured(out) else 1


def _measured(out: Outcome) -> bool:
    head = out.headline()
    return head is not None and head[1].estimate is not None and not out.exited and out.stopped_by is None
