"""``torchwatch trial PID SETTING=VALUE``: try a setting on a running training (cli/trial.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchwatch.cli.command import SIGNAL, USAGE
from torchwatch.cli.options import logging_options
from torchwatch.wire import SETTINGS

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals


class Trial:
    """``torchwatch trial``: its description names the settings a trial can switch
    (:data:`torchwatch.wire.SETTINGS`)."""

    name = "trial"
    help = "try a setting on a running training, live, and measure what it buys"
    description = (
        "Switch SETTING to VALUE in the hooked training PID (every rank of its job) for a block of "
        "steps, back for the next (on, off, off, on, ...), until the speed-up's 95 % interval is within +-5 % "
        "or --max-s passes; then put the training's value back (or keep it with --keep when faster). "
        "Settings: " + ", ".join(s.name for s in SETTINGS if s.refused is None) + ". "
        "DataLoader settings alternate whole epochs. TF32 and matmul precision change numerics: only with "
        "--allow-numerics."
    )
    usage = None
    exit_status = (
        ("0", "the speed-up was measured (its interval is printed)"),
        USAGE,
        ("1", "not measured: no such PID, no hook in it, refused, the training ended or --max-s passed first"),
        SIGNAL,
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The PID, the assignment and the trial's bounds."""
        parser.add_argument("pid", metavar="PID", help="PID of the training (a rank or the launcher of a job)")
        parser.add_argument("assignment", metavar="SETTING=VALUE", help="e.g. threads=2, num_workers=4, gc_freeze=1")
        parser.add_argument("--steps", type=int, default=None, metavar="N", help="steps per block (default: about 2 s)")
        parser.add_argument(
            "--max-s",
            type=float,
            default=60.0,
            metavar="SECONDS",
            help="end the trial after this long (5-600, default 60)",
        )
        parser.add_argument(
            "--keep", action="store_true", help="keep the new value at the end when the trial found it faster"
        )
        parser.add_argument(
            "--allow-numerics",
            action="store_true",
            help="allow settings that change the arithmetic's precision (tf32, matmul_precision)",
        )
        parser.add_argument("--json", metavar="PATH", help="also write the result as JSON ('-' for stdout)")
        logging_options(parser)

    def run(self, args: argparse.Namespace, stops: StopSignals) -> int:
        """Run the trial (:func:`torchwatch.cli.trial.trial_command`) until it ends or a stop signal."""
        from torchwatch.cli.trial import trial_command

        with stops:
            return trial_command(
                args.pid,
                args.assignment,
                steps=args.steps,
                max_s=args.max_s,
                keep=args.keep,
                allow_numerics=args.allow_numerics,
                json_path=args.json,
                stopped=lambda: stops.first,
            )
