"""GPU test helpers over the recorded NVML fixtures: a burst, features, and the settled analysis's findings."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.unit.hookrecords import hook_record
from torchwatch.analysis import features
from torchwatch.analysis.diagnosis import Analysis, Diagnoser
from torchwatch.analysis.features import Features
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.analysis.store import Window
from torchwatch.hook.summary import load_trace, summarize_trace
from torchwatch.model.readings import GpuSample, HookState

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


RULES = load_rules()


PID = 4242


LOOP: dict[str, float | None] = {
    "stack_samples": 200.0,
    "thread_samples": 100.0,
    "data_wait_share": 0.0,
    "main_running_share": 0.9,
    "loop_cpu_share": 0.3,
    "other_code_share": 0.1,
}


def burst(
    stem: str,
    t: float = 1100.0,
    age_s: float = 20.0,
    dataloader: dict[str, Any] | None = None,
    folder: Path = FIXTURES,
) -> HookState:
    """The hook's state after a burst on the trace ``folder/stem.json.gz`` ended ``age_s`` seconds before ``t``."""
    summary = summarize_trace(load_trace(folder / f"{stem}.json.gz"))
    info: dict[str, Any] = {"torch": "2.13.0", "burst": {"last": {**summary, "id": 1, "started_at": t - age_s}}}
    if dataloader is not None:
        info["dataloaders"] = [dataloader]
    record = hook_record(PID, **info)
    return HookState(t=t, pid=PID, steps=500, batches=500, data_wait_s=0.0, in_next_since=0.0, record=record)


def feats(gpus: Sequence[GpuSample] = (), hook: HookState | None = None) -> Features:
    """features.compute over the readings (GPU ones re-timed into one window), then the loop's features."""
    # a monotonic clock of a machine up for a while: a burst 900 s old is still after its start
    timed = [dataclasses.replace(g, t=1080.0 + g.t) for g in gpus]
    window = Window(start=1070.0, end=1100.0, gpus=timed, hook=[hook] if hook else [])
    f = features.compute(window, PID)
    f.update(LOOP)
    return f


def texts_of(hook: HookState) -> dict[str, str]:
    """The texts fix templates quote (features.texts) from one hook reading."""
    return features.texts(Window(start=1070.0, end=1100.0, hook=[hook]), PID)


def settle(f: Features, texts: dict[str, str] | None = None) -> Analysis:
    d = Diagnoser(RULES, why_missing=lambda name: f"why {name}")
    d.evaluate(f, 0.0, texts)
    return d.evaluate(f, 10.0, texts)


def ids(a: Analysis) -> set[str]:
    return {x.rule for x in a.findings}


def na(a: Analysis) -> dict[str, str]:
    return {n.rule: n.missing for n in a.not_applicable}
