"""``torchwatch burst PID``: ask a hooked training for a profiler burst, wait, print the summary."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import TextIO

from torchwatch import wire
from torchwatch.faces import report
from torchwatch.faces.burst import burst_lines
from torchwatch.model.errors import TorchwatchError, UsageError
from torchwatch.sources.hook import HookReader
from torchwatch.watch.bursts import refusal_t, wait_for_burst
from torchwatch.watch.target import check_attachable

PLAIN_EVERY_S = 10.0  # without a terminal: a "still waiting" line this often


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
    rec = reader.record()
    previous = rec.burst.count if rec is not None and rec.burst is not None else 0
    refused_before = refusal_t(rec)
    sent, message = reader.request_burst(wire.BurstRequest(steps=steps))
    if not sent:
        raise TorchwatchError(f"no burst: {message}", "start the training with torchwatch run, or hook it")
    print(f"torchwatch: {message}; waiting for the summary", file=sys.stderr)
    with progress(pid, wait_s) as on_wait:
        result = wait_for_burst(reader, previous, wait_s, refused_before, on_wait=on_wait)
    emit_result("\n".join(burst_lines(result)), result.to_json(), json_path, pid, "burst")
    return 1 if result.error else 0


def emit_result(text: str, data: dict[str, object], json_path: str | None, pid: int, kind: str) -> None:
    """Print a command's result: ``text`` on stdout and, with ``--json``, ``data`` as JSON to the
    path (``torchwatch-KIND-PID-TIME.json`` in a directory), or with ``--json -`` the JSON on
    stdout and the text on stderr.

    Raises:
        TorchwatchError: the JSON file cannot be written.
    """
    summary = json.dumps(data, indent=2)
    if json_path == "-":
        print(text, file=sys.stderr)
        print(summary)
        return
    print(text)
    if json_path:
        try:
            report.write_atomic(report.json_target(json_path, pid, kind), summary + "\n")
        except OSError as exc:
            raise TorchwatchError(
                f"cannot write {json_path}: {exc.strerror or exc}", "give --json a writable path"
            ) from None
