"""Pure analysis: readings in a time window → features → rule findings → one verdict.

Imports :mod:`torchwatch.model` (and the hook's standard-library helpers), never a source, the
watch loop or a face.
"""
