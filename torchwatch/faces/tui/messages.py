"""Messages the reader thread posts to the app (named after what happened)."""

from __future__ import annotations

from textual.message import Message

from torchwatch.model.observation import Observation


class ObservationRead(Message):
    """The reader thread got a new :class:`Observation` from the session.

    Only the newest matters: a queued one is replaced by the next (``can_replace``), so a
    busy UI never works through a backlog.
    """

    def __init__(self, observation: Observation) -> None:
        super().__init__()
        self.observation = observation

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
