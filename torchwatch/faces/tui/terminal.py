"""Running the TUI in a terminal that may close under it (SIGHUP when its window or SSH session ends)."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import TextIO

log = logging.getLogger(__name__)


class HangupSafe:
    """A text stream that forwards to ``stream`` and drops what a hung-up terminal refuses.

    Textual's writer thread dies on the first failed write (EIO once the terminal has closed);
    the app then blocks for ever at exit on its full queue of frames, and the report never comes.

    Attributes:
        hung_up: a write or flush failed: everything after it is dropped.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.hung_up = False

    def write(self, text: str) -> int:
        """Write ``text``, or drop it once the terminal has gone; the characters taken."""
        if not self.hung_up:
            try:
                return self._stream.write(text)
            except OSError as exc:
                log.debug("the terminal refused a write (%s): dropping the TUI's output", exc)
                self.hung_up = True
        return len(text)

    def flush(self) -> None:
        """Flush, unless the terminal has gone."""
        if not self.hung_up:
            try:
                self._stream.flush()
            except OSError:
                self.hung_up = True

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextlib.contextmanager
def hangup_safe_terminal() -> Iterator[None]:
    """While the TUI runs, its output stream (``sys.__stderr__``, where Textual's Linux driver
    draws) is a :class:`HangupSafe` around the real one."""
    real = sys.__stderr__
    if real is None:
        yield
        return
    sys.__stderr__ = HangupSafe(real)  # type: ignore[misc, assignment]
    try:
        yield
    finally:
        sys.__stderr__ = real  # type: ignore[misc]
