"""``torchwatch burst PID``: ask a hooked training for a profiler burst, wait, print the summary."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TextIO

from torchwatch.faces import report
from torchwatch.model.errors import TorchwatchError, UsageError
from torchwatch.sources.hook import HookReader
from torchwatch.watch.target import check_attachable

PLAIN_EVERY_S = 10.0  # without a terminal: a "still waiting" line this often


class BurstReader(Protocol):
    """What :func:`wait_for_burst` reads of a :class:`HookReader`."""

    pid: int

    def info(self) -> dict[str, Any] | None:
        """The hook's last published state, or ``None`` once the process is gone."""
        ...


@contextlib.contextmanager
def progress(pid: int, wait_s: float, stream: TextIO | None = None) -> Iterator[Callable[[float], None]]:
    """Show that ``torchwatch burst`` is waiting: rich's status spinner on a terminal, a plain line
    every :data:`PLAIN_EVERY_S` s otherwise.

    Yields:
        A function to call with the seconds waited so far.
    """
    stream = sys.stderr if stream is None else stream
    what = f"waiting for the burst of PID {pid}"
    if stream.isatty():
        from rich.console import Console

        with Console(file=stream).status(f"{what} (up to {wait_s:g} s)") as status:
            yield lambda waited: status.update(f"{what}: {waited:.0f} s of at most {wait_s:g} s")
        return
    last = [0.0]

    def plain(waited: float) -> None:
        if waited - last[0] >= PLAIN_EVERY_S:
            last[0] = waited
            print(f"torchwatch: still {what} ({waited:.0f} s of at most {wait_s:g} s)", file=stream, flush=True)

    yield plain


def _refusal_t(info: dict[str, Any] | None) -> float | None:
    refusal = ((info or {}).get("burst") or {}).get("last_refusal") or {}
    t = refusal.get("t")
    return float(t) if isinstance(t, (int, float)) else None


def wait_for_burst(
    reader: BurstReader,
    previous: int,
    wait_s: float,
    refused_before: float | None = None,
    poll_s: float = 0.2,
    on_wait: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Wait until the hook has finished burst number ``previous + 1``, or refused the request.

    Args:
        previous: the hook's burst count before the request.
        refused_before: the time of the hook's last refusal before the request (a newer one is ours).
        on_wait: called after each poll with the seconds waited so far (see :func:`progress`).

    Returns:
        The burst summary (``{"error": ...}`` when the burst ran and failed).

    Raises:
        TorchwatchError: the process exited, refused the burst, or ``wait_s`` passed.
    """
    started = time.monotonic()
    deadline = started + wait_s
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
        if on_wait is not None:
            on_wait(time.monotonic() - started)
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
    report.check_json_path(json_path)
    check_attachable(pid)
    reader = HookReader(pid)
    info = reader.info()
    previous = int(((info or {}).get("burst") or {}).get("count") or 0)
    refused_before = _refusal_t(info)
    sent, message = reader.request_burst({"steps": steps})
    if not sent:
        raise TorchwatchError(f"no burst: {message}", "start the training with torchwatch run, or hook it")
    print(f"torchwatch: {message}; waiting for the summary", file=sys.stderr)
    with progress(pid, wait_s) as on_wait:
        summary = wait_for_burst(reader, previous, wait_s, refused_before, on_wait=on_wait)
    text = "\n".join(report.burst_lines(summary))
    if json_path == "-":
        print(text, file=sys.stderr)
        print(json.dumps(summary, indent=2))
    else:
        print(text)
        if json_path:
            try:
                report.write_atomic(report.json_target(json_path, pid, "burst"), json.dumps(summary, indent=2) + "\n")
            except OSError as exc:
                raise TorchwatchError(
                    f"cannot write {json_path}: {exc.strerror or exc}", "give --json a writable path"
                ) from None
    return 1 if summary.get("error") else 0
