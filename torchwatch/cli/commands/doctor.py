"""``torchwatch doctor [PID] [--json]``: what works on this machine (cli/doctor.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchwatch.cli.command import USAGE
from torchwatch.cli.options import logging_options

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals


class Doctor:
    """``torchwatch doctor``."""

    name = "doctor"
    help = "check what works on this machine and, with PID, for that process"
    description = (
        "Check ptrace, py-spy, NVML, PSI, delay accounting, CPU quota, /dev/shm and the hook "
        "directory, and with PID whether it can be watched and injected into. Exit 0 when everything needed works."
    )
    usage = None
    exit_status = (("0", "everything needed works"), USAGE, ("1", "something needed does not work (printed)"))

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """An optional PID and ``--json``."""
        parser.add_argument("pid", nargs="?", metavar="PID", help="a training process to check too")
        parser.add_argument("--json", action="store_true", help="print the checks as JSON")
        logging_options(parser)

    def run(self, args: argparse.Namespace, stops: StopSignals) -> int:
        """Print the checks (:func:`torchwatch.cli.doctor.doctor_command`)."""
        from torchwatch.cli.doctor import doctor_command

        return doctor_command(args.pid, args.json)
