"""Report test helpers: the report's JSON schema, an Analysis of given features, an Observation around it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.unit.featuresets import consistent
from torchwatch.analysis.diagnosis import Analysis, Diagnoser
from torchwatch.analysis.features import CATALOGUE, Features
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.analysis.store import Store
from torchwatch.faces import report
from torchwatch.model.observation import Observation, TargetView, VerdictChange
from torchwatch.model.readings import SourceStatus, Status
from torchwatch.watch.observe import Tick, Trends, observe
from torchwatch.wire import LoaderInfo

SCHEMA = json.loads((Path(__file__).resolve().parent / "report_schema.json").read_text())


STATUSES = {
    "psutil": SourceStatus.ok(),
    "nvml": SourceStatus.unavailable("NVML library not found (no NVIDIA driver)", "ignore on a CPU-only machine"),
    "py-spy": SourceStatus.gone(),
    "hook": SourceStatus(Status.STARTING),
}


def features(**values: float | None) -> Features:
    f: Features = {name: None for name in CATALOGUE}
    f.update(stack_samples=100.0, thread_samples=50.0, **consistent(values))
    return f


def analysed(f: Features) -> Analysis:
    d = Diagnoser(load_rules(), why_missing=lambda name: "source unavailable")
    d.evaluate(f, 0.0)
    return d.evaluate(f, 10.0)


def observation(analysis: Analysis | None, exit_code: int | None = None) -> Observation:
    """What the session's builder makes of ``analysis`` for the training PID 4242 (no readings)."""
    tick = Tick(
        now=31.26,
        end=31.26,
        started=0.0,
        window_s=10.0,
        analysis=analysis,
        statuses=tuple(STATUSES.items()),
        focus_pid=4242,
        target=TargetView(4242, ("python", "train.py"), exit_code=exit_code),
        history=(VerdictChange(1.0, "undetermined"), VerdictChange(4.0, "io-bound")),
    )
    return observe(Store(), tick, Trends())


def loader_info(**settings: Any) -> LoaderInfo:
    """A DataLoader's record as the hook writes it: 64 images a batch, no workers, 100 batches
    taken in 1 s of waiting, with ``settings`` (``LoaderInfo``'s fields) over those."""
    base: dict[str, Any] = {
        "num_workers": 0,
        "batch_size": 64,
        "pin_memory": False,
        "prefetch_factor": None,
        "persistent_workers": False,
        "multiprocessing_context": None,
        "dataset": "Images",
        "collate_fn": "default_collate",
        "batches": 100,
        "wait_s": 1.0,
        "batch_bytes": None,
    }
    return LoaderInfo(**{**base, **settings})


def _loader(num_workers: int) -> dict[str, Any]:
    return loader_info(num_workers=num_workers, persistent_workers=num_workers > 0, drop_last=True).to_json()


def _report(steps_per_s: float, num_workers: int, data_wait: float, label_wait: float = 0.6) -> dict[str, Any]:
    data = report.build(observation(analysed(features(fetch_cpu_share=label_wait, worker_count=0.0)))).to_json()
    feats = data["features"]
    assert isinstance(feats, dict)
    feats.update(data_wait_share=data_wait, hook_steps_per_s=steps_per_s, rss_bytes=1e9, main_cpu_pct=99.0)
    data["hook"] = {
        "status": "ok",
        "steps": 100,
        "steps_per_s": steps_per_s,
        "step_time_ms": {"p50": 1000 / steps_per_s, "p95": 1200 / steps_per_s},
        "dataloader": _loader(num_workers),
        "usable_cpus": 2.0,
        "amp": {"autocast": False, "dtype": None, "device_type": None, "grad_scaler": False},
        "torch": "2.13.0",
    }
    back: dict[str, Any] = json.loads(json.dumps(data))  # as read back from a file
    return back
