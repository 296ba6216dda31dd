"""Typed data every part of torchwatch shares: readings, errors, the Observation and its units.

No behaviour beyond formatting; imports nothing of torchwatch but the hook's wire format
(:mod:`torchwatch.wire`, standard library only).
"""
