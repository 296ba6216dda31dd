"""Sources: one module per external system, and the only place that system is imported.

A source is polled by its own sampler thread (see :mod:`torchwatch.watch.session`). ``sample()``
may block (py-spy blocks for one recording chunk); it returns readings and never raises
for a target that exited or a missing library: it sets ``status`` instead. A source that reads
one training process (py-spy, the hook) is a :class:`FocusedSource`: the session hands it the
focus process with each call, it never asks the session for it.
"""

from __future__ import annotations

import abc
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


class FocusedSource(abc.ABC):
    """A source that reads the one training process the session diagnoses (py-spy, the hook).

    A class, not a protocol, so that the session tells the two kinds apart with ``isinstance``.

    Attributes:
        name, interval, status: as :class:`Source`.
    """

    name: str
    interval: float
    status: SourceStatus

    @abc.abstractmethod
    def sample(self, now: float, focus: int | None) -> Sequence[object]:
        """Take one round of readings stamped ``now`` (``time.monotonic()`` seconds) of ``focus``,
        the PID of the training process the session diagnoses at this moment (``None``: none
        found yet: no reading of it)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the source holds. Idempotent."""
