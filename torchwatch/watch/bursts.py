"""Waiting for a profiler burst that was asked of a hooked training (``torchwatch burst``, bench)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from torchwatch.model.errors import TorchwatchError
from torchwatch.wire import BurstResult, HookRecord


class BurstReader(Protocol):
    """What :func:`wait_for_burst` reads of a :class:`~torchwatch.sources.hook.HookReader`."""

    pid: int

    def record(self) -> HookRecord | None:
        """The hook's last published record, or ``None`` once the process is gone."""
        ...


def refusal_t(rec: HookRecord | None) -> float | None:
    """When the hook last refused a burst (monotonic s), ``None`` when it never did."""
    refusal = rec.burst.last_refusal if rec is not None and rec.burst is not None else None
    return refusal.t if refusal is not None else None


def wait_for_burst(
    reader: BurstReader,
    previous: int,
    wait_s: float,
    refused_before: float | None = None,
    poll_s: float = 0.2,
    on_wait: Callable[[float], None] | None = None,
) -> BurstResult:
    """Wait until the hook has finished burst number ``previous + 1``, or refused the request.

    Args:
        previous: the hook's burst count before the request.
        wait_s: seconds to wait at most.
        refused_before: the time of the hook's last refusal before the request (a newer one is ours).
        poll_s: seconds between two reads of the hook's record.
        on_wait: called after each poll with the seconds waited so far.

    Returns:
        The burst's result (with ``error`` set when the burst ran and failed).

    Raises:
        TorchwatchError: the process exited, refused the burst, or ``wait_s`` passed.
    """
    started = time.monotonic()
    deadline = started + wait_s
    while time.monotonic() < deadline:
        rec = reader.record()
        if rec is None:
            raise TorchwatchError(f"PID {reader.pid} exited before the burst ended", "run the burst earlier")
        burst = rec.burst
        last = burst.last if burst is not None else None
        if burst is not None and burst.state == "idle" and last is not None and last.id == previous + 1:
            return last
        count = burst.count if burst is not None else 0
        if count == previous and refusal_t(rec) != refused_before:
            refusal = burst.last_refusal if burst is not None else None
            reason = refusal.reason if refusal is not None else None
            raise TorchwatchError(f"burst refused by the hook: {reason}", "wait for it to end, then try again")
        time.sleep(poll_s)
        if on_wait is not None:
            on_wait(time.monotonic() - started)
    raise TorchwatchError(
        f"no burst result from PID {reader.pid} within {wait_s:g} s",
        "the loop may be stalled; give --wait more seconds",
    )
