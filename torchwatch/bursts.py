"""``torchwatch burst PID``: ask a hooked training for a profiler burst, wait, print the summary."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from torchwatch import report
from torchwatch.errors import TorchwatchError, UsageError
from torchwatch.sources.hook import HookReader
from torchwatch.target import check_attachable


def _refusal_t(info: dict[str, Any] | None) -> float | None:
    refusal = ((info or {}).get("burst") or {}).get("last_refusal") or {}
    t = refusal.get("t")
    return float(t) if isinstance(t, (int, float)) else None


def wait_for_burst(
    reader: HookReader, previous: int, wait_s: float, refused_before: float | None = None, poll_s: float = 0.2
) -> dict[str, Any]:
    """Wait until the hook has finished burst number ``previous + 1``, or refused the request.

    Args:
        previous: the hook's burst count before the request.
        refused_before: the time of the hook's last refusal before the request (a newer one is ours).

    Returns:
        The burst summary (``{"error": ...}`` when the burst ran and failed).

    Raises:
        TorchwatchError: the process exited, refused the burst, or ``wait_s`` passed.
    """
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        info = reader.info()
        if info is None:
            raise TorchwatchError(f"PID {reader.pid} exited before the burst ended", "run the burst earlier")
        burst = info.get("burst") or {}
        last = burst.get("last") or {}
        if burst.get("state") == "idle" and last.get("id") == previous + 1:
            return dict(last)
        if int(burst.get("count") or 0) == previous and _refusal_t(info) != refused_before:
            reason = (burst.get("last_refusal") or {}).get("reason")
            raise TorchwatchError(f"burst refused by the hook: {reason}", "wait for it to end, then try again")
        time.sleep(poll_s)
    raise TorchwatchError(
        f"no burst result from PID {reader.pid} within {wait_s:g} s",
        "the loop may be stalled; give --wait more seconds",
    )


def burst_command(pid_text: str, steps: int, wait_s: float, json_path: str | None) -> int:
    """Run one burst on PID and print its summary. Returns the exit status (0, or 1 on failure).

    Raises:
        UsageError: bad PID or step count.
        TorchwatchError: no such process, no hook, the signal not caught, refused, timed out.
    """
    try:
        pid = int(pid_text)
    except ValueError:
        raise UsageError(f"PID must be a number, not {pid_text!r}", "find it with: pgrep -af python") from None
    if not 1 <= steps <= 20:
        raise UsageError(f"--steps must be 1 to 20, not {steps}", "a burst records a few steps")
    check_attachable(pid)
    reader = HookReader(pid)
    info = reader.info()
    previous = int(((info or {}).get("burst") or {}).get("count") or 0)
    refused_before = _refusal_t(info)
    sent, message = reader.request_burst({"steps": steps})
    if not sent:
        raise TorchwatchError(f"no burst: {message}", "start the training with torchwatch run, or hook it")
    print(f"torchwatch: {message}; waiting for the summary", file=sys.stderr)
    summary = wait_for_burst(reader, previous, wait_s, refused_before)
    text = "\n".join(report.burst_lines(summary))
    if json_path == "-":
        print(text, file=sys.stderr)
        print(json.dumps(summary, indent=2))
    else:
        print(text)
        if json_path:
            with open(json_path, "w") as f:
                json.dump(summary, f, indent=2)
    return 1 if summary.get("error") else 0
