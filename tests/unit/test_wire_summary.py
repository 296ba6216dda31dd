"""The burst summary survives the hook's wire format: every key ``summarize_trace`` writes reaches
the reader with its value (the hook decodes its own ``hook.json`` before publishing it, so a key the
schema does not know would silently vanish from the features and the report)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchwatch import wire
from torchwatch.hook import summary

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRACES = [*sorted((FIXTURES / "gpu").glob("trace_*.json.gz")), FIXTURES / "traces" / "cpu_dataloader.json.gz"]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(a)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_the_schema_knows_the_summarys_categories() -> None:
    assert wire.CATEGORIES == summary.CATEGORIES
    assert wire.PHASES == summary.PHASES
    assert wire.IDLE_PARTS == summary.IDLE_PARTS


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_every_summary_key_crosses_the_wire(path: Path) -> None:
    result: dict[str, Any] = {"id": 1, "mode": "steps", "started_at": 10.0, "duration_s": 0.5, "measured_step_ms": []}
    result.update(summary.summarize_trace(summary.load_trace(path)))
    back = wire.BurstResult.decode(result, "burst.last").to_json()
    lost = {k: v for k, v in result.items() if v is not None and not _same(v, back.get(k))}
    assert not lost, f"keys lost or changed on the wire: {sorted(lost)}"
