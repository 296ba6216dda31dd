"""``python -m torchwatch`` runs the CLI."""

from torchwatch.cli import entry

entry()
