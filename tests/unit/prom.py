"""Prometheus test helpers: a free port, an Observation of two ranks, and the samples of a registry's exposition."""

from __future__ import annotations

import socket
from collections.abc import Iterable

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from torchwatch.analysis.features import CATALOGUE
from torchwatch.faces.prometheus import (
    ObservationCollector,
)
from torchwatch.model.findings import Finding, Verdict
from torchwatch.model.observation import (
    GpuRow,
    Observation,
    ProcessRow,
    RankReading,
    RankView,
    SelfUsage,
    StepsView,
    Straggler,
    TargetView,
)
from torchwatch.model.origin import Origin
from torchwatch.model.readings import GpuSample
from torchwatch.wire import RankInfo

JOB = "my-run-7"


def _finding(rule: str, label: str) -> Finding:
    return Finding(rule, label, "warning", "s", 0.5, {}, (), "test")


def _rank(rank: int, pid: int, step_ms: float, wait_ms: float, coll_ms: float, label: str) -> RankView:
    reading = RankReading(rank, pid, 2, 10, step_ms, wait_ms, step_ms - wait_ms - coll_ms, coll_ms, cpu_pct=95.0)
    return RankView(
        rank=rank,
        pid=pid,
        steps=StepsView(
            status="ok",
            pid=pid,
            steps=120 + rank,
            steps_per_s=1000 / step_ms,
            p95_ms=2 * step_ms,
            data_wait=wait_ms / step_ms,
        ),
        reading=reading,
        verdict=Verdict(label, 0.7, "x"),
        findings=(_finding(f"rule-{rank}", label),),
        rank_info=RankInfo(rank=rank, local_rank=rank, world_size=2, job=JOB),
    )


def _gpu(index: int, sm: float | None) -> GpuRow:
    sample = GpuSample(
        0.0,
        index,
        "NVIDIA H100",
        97.0,
        10 << 30,
        80 << 30,
        350.0,
        700.0,
        1980.0,
        None,
        None,
        sm_active_pct=sm,
        proc_sm_pct=90.0,
        uuid=f"GPU-{index:04d}",
    )
    return GpuRow(index, "NVIDIA H100", 97.0, 350.0, 700.0, 10 << 30, 80 << 30, True, (), (), last=sample)


def two_ranks() -> Observation:
    """A 2-rank job: rank 1 the straggler, one GPU with GPM and one without."""
    return Observation(
        t=1.0,
        elapsed_s=30.0,
        window_s=10.0,
        target=TargetView(100, ("torchrun", "train.py")),
        verdict=Verdict("dataloader-bound", 0.8, "Rank 1 is the straggler."),
        findings=(_finding("loader-cpu-in-workers", "dataloader-bound"),),
        features={
            "data_wait_share": 0.25,
            "main_cpu_pct": 150.0,
            "step_time_p50_ms": 200.0,
            "rss_bytes": 2e9,
            "read_bytes_per_s": None,
        },
        catalogue=CATALOGUE,
        ranks={
            0: _rank(0, 201, 200.0, 10.0, 80.0, "undetermined"),
            1: _rank(1, 202, 200.0, 90.0, 0.0, "dataloader-bound"),
        },
        focus_rank=1,
        straggler=Straggler(1, 202, 0, 0.4, "critical", "data", 80.0, "dataloader-bound", "x", "loader-cpu-in-workers"),
        processes=(
            ProcessRow(201, "main", "python", 95.0, 1 << 30, None, "R1", 4),
            ProcessRow(202, "main", "python", 90.0, 3 << 29, None, "R1", 4),
        ),
        gpus=(_gpu(0, 45.0), _gpu(1, None)),
        own_usage=SelfUsage(
            torchwatch_cpu_s=3.0, pyspy_cpu_s=1.5, wall_s=30.0, cpu_pct_of_core=15.0, max_rss_bytes=80 << 20
        ),
    )


def samples(
    obs: Iterable[Observation], origins: dict[int, Origin] | None = None
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample a scrape of ``obs`` gives, parsed back from the exposition text."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ObservationCollector(lambda: list(obs), "node1", (lambda: origins) if origins else None))
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
