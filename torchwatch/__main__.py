"""``python -m torchwatch`` runs the CLI."""

import sys

from torchwatch.cli import main

sys.exit(main())
