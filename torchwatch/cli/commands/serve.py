"""``torchwatch serve``: watch every training on this machine (cli/serve.py; the sessions: watch/fleet.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from torchwatch.cli.command import USAGE
from torchwatch.cli.options import count, logging_options, positive, watch_option
from torchwatch.watch.caps import MAX_PER_USER, MAX_TRAININGS

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals


class Serve:
    """``torchwatch serve``: takes ``--window``, ``--duration``, ``--rules`` and ``--hang-after`` as
    run does (:func:`~torchwatch.cli.options.watch_option`), with help of its own."""

    name = "serve"
    help = "watch every PyTorch training on this machine (one exporter per node)"
    description = (
        "Look for PyTorch trainings every --scan seconds (Python interpreters that imported torch, "
        "topmost of their tree: a torchrun launcher with its ranks; at most --max-trainings, --max-per-user of one "
        "user) and watch each from outside, with the "
        "readings of torchwatch's hook where a training carries it; nothing is injected. New trainings are "
        "picked up, ended ones dropped. --prometheus serves them all; without it a status line per training "
        "goes to stderr. SIGTERM or SIGINT stops it (exit 128+N)."
    )
    usage = None
    exit_status = (
        ("0", "--duration ran out"),
        USAGE,
        ("1", "cannot serve (the port is taken, an unwritable --log-file)"),
        ("128+N", "SIGTERM or SIGINT stopped it (143, 130)"),
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """``--prometheus`` and its web config, the scan, the caps and four watch options."""
        watch_option(parser, "--prometheus")
        parser.add_argument(
            "--web-config-file",
            type=Path,
            metavar="FILE",
            help="TLS and basic auth of --prometheus, in the Prometheus exporter-toolkit's web config format "
            "(tls_server_config, basic_auth_users; docs/security.md)",
        )
        parser.add_argument(
            "--scan", type=positive("--scan"), default=5.0, metavar="SECONDS", help="look for trainings every SECONDS"
        )
        watch_option(parser, "--window", "verdict window, 3 to 300")
        watch_option(parser, "--duration", "stop after SECONDS")
        watch_option(parser, "--rules", "add rules from DIR")
        parser.add_argument(
            "--max-trainings",
            type=count("--max-trainings"),
            default=MAX_TRAININGS,
            metavar="N",
            help=f"watch at most N trainings at once (default {MAX_TRAININGS}; each costs a session and a py-spy)",
        )
        parser.add_argument(
            "--max-per-user",
            type=count("--max-per-user"),
            default=MAX_PER_USER,
            metavar="N",
            help=f"watch at most N trainings of one user at once (default {MAX_PER_USER})",
        )
        watch_option(
            parser,
            "--hang-after",
            "a process that stepped and then makes no step for SECONDS is hung (default: max(30 s, 20 x its "
            "p95 step time)); torchwatch_rank_hang and the hang alert read it",
        )
        logging_options(parser)

    def run(self, args: argparse.Namespace, stops: StopSignals) -> int:
        """Serve until a stop signal or ``--duration`` (:func:`torchwatch.cli.serve.serve_command`)."""
        from torchwatch.cli.serve import serve_command

        with stops:
            return serve_command(
                args.prometheus,
                stops,
                scan_s=args.scan,
                window_s=args.window,
                duration=args.duration,
                rules_dirs=args.rules,
                max_trainings=args.max_trainings,
                max_per_user=args.max_per_user,
                hang_after=args.hang_after,
                web_config=args.web_config_file,
            )
