"""``torchwatch completion {bash,zsh,fish}``: print a shell completion script (cli/completion.py)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from torchwatch.cli.completion import SHELLS, script
from torchwatch.cli.options import logging_options

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals


class Completion:
    """``torchwatch completion``: the script is made from :func:`torchwatch.cli.build_parser`."""

    name = "completion"
    help = "print a shell completion script (bash, zsh, fish)"
    description = (
        "Print the completion script for SHELL, made from this parser. bash: add "
        "'source <(torchwatch completion bash)' to ~/.bashrc; zsh: the same with zsh in ~/.zshrc; fish: "
        "torchwatch completion fish > ~/.config/fish/completions/torchwatch.fish"
    )
    usage = None
    exit_status = (("0", "the script was printed"), ("2", "a shell other than bash, zsh, fish"))

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The shell."""
        parser.add_argument("shell", choices=SHELLS, help="the shell")
        logging_options(parser)

    def run(self, args: argparse.Namespace, stops: StopSignals) -> int:
        """Print the script; 0."""
        from torchwatch.cli import build_parser

        sys.stdout.write(script(args.shell, build_parser()))
        return 0
