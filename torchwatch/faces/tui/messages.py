"""Messages the reader thread posts to the app (named after what happened)."""

from __future__ import annotations

from textual.message import Message

from torchwatch.model.observation import Observation


class ObservationRead(Message):
    """The reader thread got a new :class:`Observation` from the session.

    Only the newest matters: a queued one is replaced by the next (``can_replace``), so a
    busy UI never works through a backlog.

    Args:
        observation: what the session returned.
        started: ``time.monotonic()`` (s) when that read began: the app draws no read begun
            before the one it shows (a read on its own thread, ``refresh_view``, may finish
            first: the older one would put back a state the training has left, e.g. a live
            verdict over "The training exited").
    """

    def __init__(self, observation: Observation, started: float = float("-inf")) -> None:
        super().__init__()
        self.observation = observation
        self.started = started

    def can_replace(self, message: Message) -> bool:
        """A newer observation replaces an older one still in the queue."""
        return isinstance(message, ObservationRead)


class LogRead(Message):
    """New lines of the training's output (``run`` mode)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines


class ReaderFailed(Message):
    """Reading the session raised: shown once, the reader keeps going."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error
