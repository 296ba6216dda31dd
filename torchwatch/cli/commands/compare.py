"""``torchwatch compare A.json B.json [--markdown]``: two reports side by side (faces/compare.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchwatch.cli.options import logging_options

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals


class Compare:
    """``torchwatch compare``."""

    name = "compare"
    help = "compare two JSON reports: speedup, verdicts, settings that differ, features that moved"
    description = (
        "Compare report A (before) with report B (after), both written by run/attach --json: steps/s "
        "change (x, %), both verdicts, the settings that differ and those that do not, the features that moved "
        "most. Exit 2 when a file is not a torchwatch report."
    )
    usage = None
    exit_status = (
        ("0", "the comparison was printed"),
        ("2", "a bad option, or a file that is not a torchwatch report"),
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The two reports and ``--markdown``."""
        parser.add_argument("a", metavar="A.json", help="the report before the change")
        parser.add_argument("b", metavar="B.json", help="the report after the change")
        parser.add_argument("--markdown", action="store_true", help="print Markdown, for a pull-request comment")
        logging_options(parser)

    def run(self, args: argparse.Namespace, stops: StopSignals) -> int:
        """Print the comparison (:func:`torchwatch.faces.compare.compare_files`); 0."""
        from torchwatch.faces.compare import compare_files

        print(compare_files(args.a, args.b, args.markdown))
        return 0
