"""torchwatch: tells a PyTorch user, live, why their training is slow and what to change."""

__version__ = "0.1.0"
