"""torchwatch's log: ``-v`` and ``--log-file`` (:func:`configure_logging`), every record on one
line with a watched process's text escaped (:class:`OneLineFormatter`)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from torchwatch.model import files
from torchwatch.model.errors import TorchwatchError
from torchwatch.model.text import escape


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever ``sys.stderr`` is when a record comes (the TUI swaps it out
    while it runs, so log lines never land on its screen)."""

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record`` to the current ``sys.stderr``."""
        self.stream = sys.stderr
        super().emit(record)


class _LogFile(logging.StreamHandler):  # type: ignore[type-arg]
    """``--log-file``: a handler on a file opened by :func:`torchwatch.model.files.open_append`
    (never through a symbolic link, nor in a directory another user can change), closed with it."""

    def close(self) -> None:
        """Flush and close the file."""
        try:
            self.flush()
            self.stream.close()
        finally:
            super().close()


class OneLineFormatter(logging.Formatter):
    """Every record on one line of its own: the message (which may carry a target's text: a
    frame's function name, a command line) has its characters that are not printable escaped
    (:func:`torchwatch.model.text.escape`), and a traceback's lines are indented, so nothing
    written by a watched process can pass for a record of its own in the log."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The record's line, its message escaped."""
        safe = logging.makeLogRecord(record.__dict__)
        safe.message = escape(record.message)
        return super().formatMessage(safe)

    def formatException(self, ei: Any) -> str:
        """The traceback, each line escaped and indented."""
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        """The stack, each line escaped and indented."""
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("    " + escape(line) for line in text.split("\n"))


def configure_logging(verbose: bool, log_file: Path | None) -> None:
    """Configure the ``torchwatch`` loggers: warnings (debug with ``verbose``) on stderr, or every
    record from info up (debug with ``verbose``) appended to ``log_file``. Every record is one
    line (:class:`OneLineFormatter`); the file is opened as :func:`torchwatch.model.files.open_append`
    does (created 0600; a symbolic link, another user's file or a directory another user can
    change is refused).

    Raises:
        TorchwatchError: ``log_file`` cannot be opened for appending, or is refused.
    """
    root = logging.getLogger("torchwatch")
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    handler: logging.Handler
    if log_file is not None:
        try:
            stream = os.fdopen(files.open_append(log_file.expanduser()), "a", encoding="utf-8")
        except OSError as exc:
            raise TorchwatchError(
                f"cannot write the log to {log_file}: {exc.strerror or exc}",
                files.UNSAFE_HINT.format(option="--log-file")
                if isinstance(exc, files.UnsafePath)
                else "give --log-file a path in an existing, writable directory",
            ) from None
        handler = _LogFile(stream)
        handler.setFormatter(
            OneLineFormatter("%(asctime)s %(levelname)s %(process)d %(threadName)s %(name)s: %(message)s")
        )
        root.setLevel(logging.DEBUG if verbose else logging.INFO)
    else:
        handler = _CurrentStderr()
        handler.setFormatter(OneLineFormatter("torchwatch: %(levelname)s: %(message)s"))
        root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    root.addHandler(handler)
