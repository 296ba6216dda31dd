"""``torchwatch rules check DIR`` and ``torchwatch rules list``: the diagnosis rules (analysis/rules_engine.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from torchwatch.cli.command import Parser
from torchwatch.cli.options import logging_options, watch_option

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals


class Rules:
    """``torchwatch rules``: its actions are sub-commands of their own (``check``, ``list``)."""

    name = "rules"
    help = "check or list diagnosis rules"
    description = None
    usage = None
    exit_status = (("0", "the rules are valid (check) or were listed"), ("2", "a malformed rule file or a bad option"))

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """``check DIR`` and ``list [--rules DIR]``."""
        actions = parser.add_subparsers(dest="rules_command", metavar="ACTION", parser_class=Parser, required=True)
        check = actions.add_parser("check", help="validate the *.toml rule files of DIR")
        check.add_argument("dir", type=Path, metavar="DIR")
        logging_options(check)
        listing = actions.add_parser("list", help="print the rules in use with their thresholds' sources")
        watch_option(listing, "--rules", "include the rules of DIR, as run and attach would")
        logging_options(listing)

    def run(self, args: argparse.Namespace, stops: StopSignals) -> int:
        """Check DIR's rules, or list the rules in use; 0 (a malformed rule raises ``UsageError``)."""
        from torchwatch.analysis.rules_engine import load_dir, load_rules

        if args.rules_command == "check":
            found = load_dir(args.dir)
            print(f"{len(found)} rule(s) OK in {args.dir}: {', '.join(r.id for r in found) or 'none'}")
            return 0
        for r in sorted(load_rules(args.rules), key=lambda r: r.id):
            print(f"{r.id:28s} {r.label:17s} {r.severity:9s} when {r.when.text}")
            print(f"{'':28s} source: {r.source}")
        return 0
