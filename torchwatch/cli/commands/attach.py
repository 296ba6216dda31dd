"""``torchwatch attach PID``: watch a running training (cli/drive.py; the injection: cli/injecting.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchwatch.cli.command import EXIT_STATUS
from torchwatch.cli.options import WatchOptions, watch_options
from torchwatch.model.errors import UsageError

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals


class Attach:
    """``torchwatch attach``: run's exit statuses but the training's own (attach did not start it)."""

    name = "attach"
    help = "watch a running training process"
    description = (
        "Watch the running process PID and its children (torchwatch itself and its helpers excluded). "
        "A PID that is not a training but whose tree holds several (PID 1, a shell running two) is refused with "
        "their PIDs: attach to one, or watch them all with torchwatch serve."
    )
    usage = None
    exit_status = tuple(row for row in EXIT_STATUS if row[0] != "N")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The watch options, the PID, ``--no-inject`` and ``--keep-hook``."""
        watch_options(parser)
        parser.add_argument("pid", metavar="PID", help="PID of the training process")
        parser.add_argument(
            "--no-inject",
            action="store_true",
            help="do not inject the hook into the training (outside readings only: no step times, data wait, "
            "DataLoader settings or bursts)",
        )
        parser.add_argument(
            "--keep-hook",
            action="store_true",
            help="leave the injected hook in the training when attach ends (take it out later with torchwatch detach)",
        )

    def run(self, args: argparse.Namespace, stops: StopSignals) -> int:
        """Attach to PID and watch it.

        Raises:
            UsageError: a PID that is not a number.
        """
        from torchwatch.cli.drive import attach_pid

        with stops:
            try:
                pid = int(args.pid)
            except ValueError:
                raise UsageError(f"PID must be a number, not {args.pid!r}", "find it with: pgrep -af python") from None
            return attach_pid(pid, WatchOptions.from_args(args), stops)
