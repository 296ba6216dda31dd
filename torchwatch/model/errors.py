"""The one user-facing error type (a message, a hint and an exit code, printed as one line), and the exit codes."""

from __future__ import annotations

from torchwatch.model.text import escape

EXIT_CANNOT_WATCH = 1  # torchwatch could not watch: bad input, or an internal error while watching
EXIT_USAGE = 2  # a bad option or value, a malformed rule file
EXIT_FAIL_ON = 3  # --fail-on matched the final verdict (and the status would otherwise be 0)


def shell_status(returncode: int) -> int:
    """A process's exit status as a shell shows it: a child killed by signal N gives 128+N
    (``returncode`` as :attr:`subprocess.Popen.returncode`, negative for a signal)."""
    return 128 - returncode if returncode < 0 else returncode


class TorchwatchError(Exception):
    """An error the user can act on; ``cli.main`` prints it as one line and exits.

    Args:
        message: what went wrong, one sentence without a trailing period.
        hint: what to do about it, or ``None``.
        exit_code: process exit status; 2 for usage errors, 1 for "cannot watch".
    """

    def __init__(self, message: str, hint: str | None = None, exit_code: int = EXIT_CANNOT_WATCH) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def one_line(self) -> str:
        """``torchwatch: error: MESSAGE (hint: HINT)`` on a single line; other characters that are
        not printable (a command line's escape sequence) come escaped (:func:`torchwatch.model.text.escape`)."""
        text = f"torchwatch: error: {self.message}"
        if self.hint:
            text += f" (hint: {self.hint})"
        return escape(text.replace("\n", " "))


class UsageError(TorchwatchError):
    """Bad command line: exit code 2."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint, exit_code=EXIT_USAGE)


class RuleError(TorchwatchError):
    """A rule file that cannot be loaded: names the file, the line and the problem."""

    def __init__(self, path: str, line: int | None, problem: str) -> None:
        where = f"{path}:{line}" if line else path
        super().__init__(
            f"bad rule file {where}: {problem}",
            "fix the rule file, then check it with 'torchwatch rules check DIR'",
            exit_code=EXIT_USAGE,
        )
        self.path = path
        self.line = line
        self.problem = problem
