"""Watching a training: the session (sampler threads, analysis thread), the target (launch,
attach, stop) and the drivers of ``run`` and ``attach``."""
