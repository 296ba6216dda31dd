"""The app's reader thread: gets the session's Observation and the training's log, posts messages.

It runs beside the session's samplers and is the only thread of the TUI that asks the session
for anything; widgets change only when the app receives its messages (memray's ``UpdateThread``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from textual.message import Message

from torchwatch.faces.tui.messages import LogRead, ObservationRead, ReaderFailed
from torchwatch.model.observation import Observation

log = logging.getLogger(__name__)

LOG_CHUNK_BYTES = 256 * 1024  # most bytes of log read per refresh: a chatty training cannot stall the UI
LOG_LINE_CHARS = 2000  # longer lines (progress bars without newlines) are cut


class LogTail:
    """Reads the lines appended to a file since the last call, bounded per call.

    Args:
        path: the log file (it may not exist yet).
        chunk: most bytes read per call; when more was appended, the oldest part is skipped
            and one line says how much.
    """

    def __init__(self, path: Path, chunk: int = LOG_CHUNK_BYTES) -> None:
        self.path = path
        self.chunk = chunk
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[str]:
        """Complete lines appended since the last call (carriage-return updates keep their last state)."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return []
        if size < self._offset:  # truncated or replaced: start over
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        skipped = 0
        if size - self._offset > self.chunk:
            skipped = size - self.chunk - self._offset
            self._offset, self._partial = size - self.chunk, b""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(size - self._offset)
        except OSError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        if len(self._partial) > LOG_LINE_CHARS:
            complete.append(self._partial)
            self._partial = b""
        lines = [ln.decode(errors="replace").rsplit("\r", 1)[-1][:LOG_LINE_CHARS] for ln in complete]
        if skipped:
            lines.insert(0, f"[torchwatch: {skipped} bytes of output skipped]")
        return lines


class Reader(threading.Thread):
    """Every ``interval`` s: get an Observation and new log lines, post them to the app.

    Args:
        read: returns the :class:`Observation` to show (blocking is fine: this is a plain thread).
        post: the app's ``post_message`` (thread-safe).
        interval: seconds between two reads (the refresh period).
        log: the training's log to tail, or ``None``.
    """

    def __init__(
        self,
        read: Callable[[], Observation],
        post: Callable[[Message], bool],
        interval: float,
        log: LogTail | None = None,
    ) -> None:
        super().__init__(name="torchwatch-tui-reader", daemon=True)
        self._read = read
        self._post = post
        self.interval = interval
        self._log = log
        self._stop_event = threading.Event()
        self._failed = False

    def run(self) -> None:
        """Read and post until :meth:`stop`; errors are posted once and do not end the loop."""
        while not self._stop_event.wait(self.interval):
            self.read_once()

    def read_once(self) -> None:
        """One round: an Observation, then the log's new lines."""
        try:
            started = time.monotonic()
            self._post(ObservationRead(self._read(), started))
            self._failed = False
        except Exception as exc:
            if not self._failed:
                log.warning("reading the session for the TUI failed: %r", exc, exc_info=True)
                self._post(ReaderFailed(f"reading the session failed: {exc!r}"))
            self._failed = True
        if self._log is not None:
            lines = self._log.read_new()
            if lines:
                self._post(LogRead(lines))

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the thread to end and wait for it (at most ``timeout`` s)."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)
