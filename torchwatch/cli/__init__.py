"""Command line: ``torchwatch run [OPTIONS] -- CMD...``, ``attach``, ``serve`` and the other commands
of :data:`COMMANDS` (one module each under ``torchwatch/cli/commands/``).

Errors are one line on stderr with a hint and a non-zero exit, never a traceback; the exit
statuses are in :data:`EXIT_STATUS` (run's, printed by ``--help``, listed in the README) and
:data:`COMMAND_EXIT_STATUS` (each command's, printed by its ``--help``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from torchwatch import __version__
from torchwatch.cli.command import ENVIRONMENT, EXIT_STATUS, Command, ExitRows, Parser, epilog
from torchwatch.cli.commands import COMMANDS
from torchwatch.cli.logs import OneLineFormatter, configure_logging
from torchwatch.cli.options import logging_options
from torchwatch.model.errors import TorchwatchError

__all__ = [
    "COMMANDS",
    "COMMAND_EXIT_STATUS",
    "ENVIRONMENT",
    "EXIT_STATUS",
    "Command",
    "OneLineFormatter",
    "build_parser",
    "configure_logging",
    "entry",
    "epilog",
    "main",
]

log = logging.getLogger(__name__)

# Each command's own exit statuses (its --help prints them); run's are EXIT_STATUS.
COMMAND_EXIT_STATUS: dict[str, ExitRows] = {command.name: command.exit_status for command in COMMANDS}
_BY_NAME: dict[str, Command] = {command.name: command for command in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: the top level's options, then one sub-parser per command of
    :data:`COMMANDS`, in their order (exposed for tests, docs and the completion scripts)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = Parser(
        prog="torchwatch",
        description="Tells you, live, why your PyTorch training is slow.",
        epilog=epilog(),
        formatter_class=fmt,
    )
    parser.add_argument("-V", "--version", action="version", version=f"torchwatch {__version__}")
    logging_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        command.add_arguments(
            sub.add_parser(
                command.name,
                help=command.help,
                description=command.description,
                usage=command.usage,
                epilog=epilog(command.exit_status),
                formatter_class=fmt,
            )
        )
    return parser


_STDOUT_CLOSED = TorchwatchError(
    "stdout is closed: what torchwatch had to print there was not written",
    "run it with an open stdout (or --json PATH for the report)",
)


def _quiet_stdout() -> None:
    """stdout's reader went away: point stdout at /dev/null so the exit's flush cannot fail too
    (the recipe of the Python documentation's note on SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: Sequence[str] | None = None, *, exit_by_signal: bool = False) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Args:
        exit_by_signal: when a stop signal ended ``run`` or ``attach``, end the process by that
            signal after the report (the console script does; tests calling ``main`` do not).
    """
    from torchwatch.watch.lifecycle import StopSignals

    parser = build_parser()
    stops = StopSignals()
    code = 0
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        configure_logging(args.verbose, args.log_file)
        code = _BY_NAME[args.command].run(args, stops)
        if sys.stdout is None:  # started with stdout closed (>&-): what it had to say went nowhere
            print(_STDOUT_CLOSED.one_line(), file=sys.stderr)
            code = code or _STDOUT_CLOSED.exit_code
        else:
            sys.stdout.flush()  # a closed stdout shows here, inside the handlers below
    except TorchwatchError as exc:
        print(exc.one_line(), file=sys.stderr)
        code = exc.exit_code
    except BrokenPipeError:
        _quiet_stdout()  # quietly, as `| head` expects (the Python documentation's note on SIGPIPE)
        code = code or _STDOUT_CLOSED.exit_code
    except KeyboardInterrupt:
        print("torchwatch: interrupted", file=sys.stderr)
        code = 130
    except Exception as exc:
        log.debug("internal error", exc_info=True)
        print(
            f"torchwatch: error: internal error: {exc!r} (hint: run again with -v --log-file PATH and report the log)",
            file=sys.stderr,
        )
        code = 1
    if stops.first is not None:
        code = 128 + stops.first
        if exit_by_signal:
            stops.exit_like_the_signal()
    return code


def entry() -> NoReturn:
    """The ``torchwatch`` console script and ``python -m torchwatch``."""
    sys.exit(main(exit_by_signal=True))


if __name__ == "__main__":  # pragma: no cover
    entry()
