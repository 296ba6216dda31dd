"""``torchwatch burst PID``: ask a hooked training for a profiler burst (cli/burst.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchwatch.cli.command import INTERRUPTED, USAGE
from torchwatch.cli.options import duration, logging_options

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals


class Burst:
    """``torchwatch burst``."""

    name = "burst"
    help = "ask a hooked training for a torch.profiler burst and print its summary"
    description = (
        "Ask the hook in PID for a short torch.profiler burst (it must catch the signal), wait for it "
        "(a spinner on a terminal), print the step-time breakdown and the trace path."
    )
    usage = None
    exit_status = (
        ("0", "the burst's summary was printed"),
        USAGE,
        ("1", "no burst: no such PID, no hook in it, the signal not caught, refused, timed out"),
        INTERRUPTED,
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The PID, ``--steps``, ``--wait`` and ``--json``."""
        parser.add_argument(
            "pid", metavar="PID", help="PID of the training process (started by torchwatch run, or hooked)"
        )
        parser.add_argument(
            "--steps", type=int, default=3, metavar="N", help="active steps to record (1-20, default 3)"
        )
        parser.add_argument("--wait", type=duration, default=60.0, metavar="SECONDS", help="give up after SECONDS")
        parser.add_argument("--json", metavar="PATH", help="also write the summary as JSON ('-' for stdout)")
        logging_options(parser)

    def run(self, args: argparse.Namespace, stops: StopSignals) -> int:
        """Run the burst (:func:`torchwatch.cli.burst.burst_command`)."""
        from torchwatch.cli.burst import burst_command

        return burst_command(args.pid, args.steps, args.wait, args.json)
