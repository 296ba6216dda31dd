"""The :class:`Command` protocol every ``torchwatch`` command follows, the parser that reports
usage errors as one line, and the text after each command's ``--help`` (exit statuses,
environment).

A command is a module under ``torchwatch/cli/`` holding a class that has a ``name``, a one-line
``help``, its ``exit_status`` rows, ``add_arguments(parser)`` and ``run(args, stops) -> int``; it is
listed once in :data:`torchwatch.cli.commands.COMMANDS` (docs/architecture.md, "A command").
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, NoReturn, Protocol

from torchwatch.model.errors import UsageError

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals

ExitRows = tuple[tuple[str, str], ...]

# Every TORCHWATCH_* variable torchwatch or its hook reads (tests/unit/test_cli.py checks the code
# against this list, and the README against it).
ENVIRONMENT = {
    "TORCHWATCH_DIR": "where the hook publishes its state (default $TMPDIR/torchwatch-UID); "
    "torchwatch reads it from the training's environment",
    "TORCHWATCH_SIGNAL": "the signal that asks the hook for a profiler burst (default SIGUSR2)",
    "TORCHWATCH_BURST_AT": "optimizer steps at which the hook runs a burst by itself (set by --burst-at)",
    "TORCHWATCH_BURST_COOLDOWN_S": "seconds the hook refuses a new burst after one (default 5)",
    "TORCHWATCH_TRACE_DIR": "where burst traces are written (default ~/.cache/torchwatch/traces)",
    "TORCHWATCH_FLOPS": "'0': bursts count no FLOPs in their warmup step (no FLOP/s, no MFU)",
    "TORCHWATCH_HOOK": "'1' makes the hook's sitecustomize install the hook (set by run)",
    "TORCHWATCH_HOOK_PATH": "the directory holding the torchwatch package the hook is loaded from, by "
    "path (set by run)",
    "TORCHWATCH_BOOT_NOTE": "the file where run's hook boot says why it could not load the hook (set by run)",
    "TORCHWATCH_SPAWNED_RANK": "set by the hook around torch.multiprocessing.spawn: the processes it "
    "starts are ranks and get the hook (their DataLoader workers do not); not for users",
    "TORCHWATCH_JOB": "the job key every rank of the job shares on every node (the training_job label); "
    "wins over TORCHELASTIC_RUN_ID, MASTER_ADDR:MASTER_PORT and SLURM_JOB_ID (docs/fleet.md)",
    "TORCHWATCH_NODE_NAME": "serve: the host label (default the hostname; in a Kubernetes pod, the node's name)",
}

# run's exit statuses (the top-level --help prints them too; the README lists them)
EXIT_STATUS: ExitRows = (
    ("N", "run: the training's own exit status (128+N when signal N ended it)"),
    ("0", "torchwatch stopped the training as asked (--duration, q in the TUI), or watching ended normally"),
    (
        "3",
        "--fail-on: the final verdict is one of its labels, or it names hang and a hang was recorded "
        "(and the status would have been 0)",
    ),
    ("2", "usage error: a bad option or value, a malformed rule file"),
    (
        "1",
        "cannot watch (no such PID, not Python, another user's process, command not found, "
        "a PID whose tree holds several trainings, unwritable --json/--trace/--log-file), a --json report that "
        "could not be written at the end, an internal error, or stdout closed before the report",
    ),
    (
        "128+N",
        "torchwatch got signal N (SIGINT 130, SIGTERM 143, SIGHUP 129): it stopped the training, "
        "wrote the report, then ended by that signal",
    ),
)

# rows several commands share
USAGE = ("2", "usage error: a bad option or value")
SIGNAL = ("128+N", "torchwatch got signal N (SIGINT 130, SIGTERM 143): it stopped, then ended by that signal")
INTERRUPTED = ("130", "interrupted (Ctrl-C)")


class Command(Protocol):
    """One ``torchwatch`` command: what its parser holds and what it does.

    ``name`` is the word after ``torchwatch``; ``help`` its line in ``torchwatch --help``;
    ``description`` and ``usage`` (``None``: argparse's) head its own ``--help``, and
    ``exit_status`` (``(code, meaning)`` rows) ends it, with the environment variables.
    """

    @property
    def name(self) -> str: ...

    @property
    def help(self) -> str: ...

    @property
    def description(self) -> str | None: ...

    @property
    def usage(self) -> str | None: ...

    @property
    def exit_status(self) -> ExitRows: ...

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare the command's arguments on ``parser`` (its own ``-v``/``--log-file`` included,
        :func:`torchwatch.cli.options.logging_options`, where its ``--help`` lists them)."""
        ...

    def run(self, args: argparse.Namespace, stops: StopSignals) -> int:
        """Do the command; returns its exit status (one of ``exit_status``).

        ``stops`` is not installed: a command that must end cleanly on SIGINT/SIGTERM/SIGHUP
        runs inside ``with stops:``. Raises :class:`~torchwatch.model.errors.TorchwatchError`
        for a one-line error (its exit code), never prints a traceback.
        """
        ...


def epilog(rows: ExitRows = EXIT_STATUS) -> str:
    """The text after a command's ``--help``: its exit statuses ``rows`` and the environment variables."""
    lines = ["exit status:"]
    lines += [f"  {code:6s} {text}" for code, text in rows]
    lines += ["", "environment (set in the training's environment; run sets the hook's itself):"]
    lines += [f"  {name:28s} {text}" for name, text in ENVIRONMENT.items()]
    return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with a hint, exit 2."""

    def error(self, message: str) -> NoReturn:
        """Raise a one-line :class:`UsageError` (exit 2) instead of printing usage."""
        raise UsageError(message, f"see: {self.prog} --help")
