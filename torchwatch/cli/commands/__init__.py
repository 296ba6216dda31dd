"""Every ``torchwatch`` command, one module each (:class:`torchwatch.cli.command.Command`), in the
order ``torchwatch --help`` lists them.

A command module declares the command's parser and says what it runs; the work itself is imported
when the command runs (``cli/drive.py``, ``cli/serve.py``, ...), so that ``--help`` and the shell
completion scripts load no watch machinery (each such module costs 0.15-0.35 s to import).
"""

from __future__ import annotations

from torchwatch.cli.command import Command
from torchwatch.cli.commands.attach import Attach
from torchwatch.cli.commands.burst import Burst
from torchwatch.cli.commands.compare import Compare
from torchwatch.cli.commands.completion import Completion
from torchwatch.cli.commands.detach import Detach
from torchwatch.cli.commands.doctor import Doctor
from torchwatch.cli.commands.rules import Rules
from torchwatch.cli.commands.run import Run
from torchwatch.cli.commands.serve import Serve
from torchwatch.cli.commands.trial import Trial

COMMANDS: tuple[Command, ...] = (
    Run(),
    Attach(),
    Detach(),
    Burst(),
    Trial(),
    Rules(),
    Doctor(),
    Compare(),
    Serve(),
    Completion(),
)
