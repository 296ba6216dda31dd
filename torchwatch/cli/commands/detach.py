"""``torchwatch detach PID``: take the hook attach injected out of a training (cli/injecting.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchwatch.cli.command import INTERRUPTED, USAGE
from torchwatch.cli.options import logging_options

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals


class Detach:
    """``torchwatch detach``."""

    name = "detach"
    help = "take the hook that attach injected out of a training"
    description = (
        "Take the hook torchwatch attach injected out of PID: its burst signal handler is put back, "
        "torch is unpatched and the hook's files are removed. attach does this itself when it ends."
    )
    usage = None
    exit_status = (
        ("0", "the hook was taken out"),
        USAGE,
        ("1", "nothing taken out: no such PID, no hook attach injected, another user's process, the injection failed"),
        INTERRUPTED,
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The PID."""
        parser.add_argument("pid", metavar="PID", help="PID of the training process")
        logging_options(parser)

    def run(self, args: argparse.Namespace, stops: StopSignals) -> int:
        """Take the hook out (:func:`torchwatch.cli.injecting.detach_command`)."""
        from torchwatch.cli.injecting import detach_command

        return detach_command(args.pid)
