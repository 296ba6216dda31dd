"""Sources: one module per external system, and the only place that system is imported.

A source is polled by its own sampler thread (see :mod:`torchwatch.watch.session`). ``sample()``
may block (py-spy blocks for one recording chunk); it returns readings and never raises
for a target that exited or a missing library: it sets ``status`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from torchwatch.model.readings import SourceStatus


class Source(Protocol):
    """What the session needs from a source.

    Attributes:
        name: key in the report's ``sources`` object (``psutil``, ``nvml``, ``py-spy``, ``hook``).
        interval: seconds between the starts of two ``sample()`` calls.
        status: the current :class:`SourceStatus`.
    """

    name: str
    interval: float
    status: SourceStatus

    def sample(self, now: float) -> Sequence[object]:
        """Take one round of readings stamped ``now`` (``time.monotonic()`` seconds)."""
        ...

    def close(self) -> None:
        """Release what the source holds (subprocesses, library handles). Idempotent."""
        ...
