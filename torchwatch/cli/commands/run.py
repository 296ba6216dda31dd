"""``torchwatch run [OPTIONS] -- COMMAND [ARGS...]``: launch a training and watch it (cli/drive.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchwatch.cli.command import EXIT_STATUS
from torchwatch.cli.options import WatchOptions, steps, watch_options
from torchwatch.model.errors import UsageError

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals


class Run:
    """``torchwatch run``: exits with the training's own status (:data:`~torchwatch.cli.command.EXIT_STATUS`)."""

    name = "run"
    help = "launch a training command and watch it"
    description = "Launch COMMAND and watch it; exits with COMMAND's exit status (0 when torchwatch stopped it)."
    usage = "torchwatch run [OPTIONS] -- COMMAND [ARGS...]"
    exit_status = EXIT_STATUS

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The watch options, ``--no-hook``, ``--burst-at`` and the command."""
        watch_options(parser)
        parser.add_argument(
            "--no-hook", action="store_true", help="do not pre-load the in-process hook (outside readings only)"
        )
        parser.add_argument(
            "--burst-at",
            type=steps,
            metavar="STEP[,STEP...]",
            help="run a torch.profiler burst at these optimizer steps (the trace path is in the report)",
        )
        parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND", help="the training command")

    def run(self, args: argparse.Namespace, stops: StopSignals) -> int:
        """Launch and watch the command.

        Raises:
            UsageError: no command after ``--``.
        """
        from torchwatch.cli.drive import run_command

        cmd = list(args.cmd)
        if cmd and cmd[0] == "--":
            cmd = cmd[1:]
        with stops:
            if not cmd:
                raise UsageError("no command to run", "usage: torchwatch run [OPTIONS] -- python train.py")
            return run_command(cmd, WatchOptions.from_args(args), stops)
