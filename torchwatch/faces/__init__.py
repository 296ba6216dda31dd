"""What a person or a program sees: the report (JSON and text), the headless status line, the
burst summary and the TUI. Every face is a function of one
:class:`~torchwatch.model.observation.Observation`; none reads a source, the store or the hook's files.
"""
