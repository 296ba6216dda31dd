"""Recorded readings for the TUI tests, replayed through the real Observation builder (and a check
that they diagnose as recorded).

The stacks are py-spy's own output for a DataLoader training with two workers
(``tests/fixtures/pyspy/dataloader_nw2_subprocesses.raw``), replayed as four 3 s chunks; the
process, thread and GPU readings follow the same run's shape (the loop waits on two busy
workers), and so does the hook's ``hook.json`` (``tests/fixtures/hook``), read through the wire
decoder. The clock is frozen at :data:`NOW`: nothing on screen depends on the wall clock.
"""

from __future__ import annotations

from tests.unit.recorded import NOW, analyse, recorded_store
from torchwatch.model.readings import (
    StackSample,
)


def test_recorded_readings_are_dataloader_bound() -> None:
    analysis = analyse(recorded_store())
    assert analysis.verdict.label == "dataloader-bound", analysis.verdict
    assert {f.rule for f in analysis.findings} == {"loader-cpu-contention", "loader-cpu-in-workers"}
    assert any(isinstance(s, StackSample) for s in recorded_store().window(0, NOW).stacks)
