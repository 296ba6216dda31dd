"""Usable CPUs (torchwatch.wire.cpus: affinity, cgroup quota) and the worker count to suggest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchwatch.analysis.workers import io_bound_workers, suggested_workers
from torchwatch.wire import cpus as wire_cpus
from torchwatch.wire import usable_cpus
from torchwatch.wire.cpus import _read_v1_quota, _read_v2_quota


def test_usable_cpus_is_within_bounds() -> None:
    n = usable_cpus()
    assert 1.0 <= n <= (os.cpu_count() or 1)
    assert usable_cpus(os.getpid()) == n


def test_usable_cpus_of_missing_pid_falls_back() -> None:
    assert 1.0 <= usable_cpus(999_999_999) <= (os.cpu_count() or 1)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("max 100000\n", None),
        ("150000 100000\n", 1.5),
        ("50000 100000", 0.5),
        ("", None),
        ("100000", None),
    ],
)
def test_read_v2_quota(tmp_path: Path, text: str, want: float | None) -> None:
    p = tmp_path / "cpu.max"
    p.write_text(text)
    assert _read_v2_quota(p) == want


def test_read_v2_quota_missing_file(tmp_path: Path) -> None:
    assert _read_v2_quota(tmp_path / "nope" / "cpu.max") is None


@pytest.mark.parametrize(
    ("quota", "period", "want"),
    [
        ("-1", "100000", None),
        ("250000", "100000", 2.5),
        ("garbage", "100000", None),
    ],
)
def test_read_v1_quota(tmp_path: Path, quota: str, period: str, want: float | None) -> None:
    (tmp_path / "cpu.cfs_quota_us").write_text(quota + "\n")
    (tmp_path / "cpu.cfs_period_us").write_text(period + "\n")
    assert _read_v1_quota(tmp_path) == want


def test_quota_caps_affinity_but_not_below_one(monkeypatch: pytest.MonkeyPatch) -> None:
    affinity = float(len(os.sched_getaffinity(0)))
    monkeypatch.setattr(wire_cpus, "_cgroup_quota", lambda pid: 0.2)
    assert usable_cpus() == 1.0
    monkeypatch.setattr(wire_cpus, "_cgroup_quota", lambda pid: affinity + 8)
    assert usable_cpus() == affinity
    monkeypatch.setattr(wire_cpus, "_cgroup_quota", lambda pid: None)
    assert usable_cpus() == max(1.0, affinity)


@pytest.mark.parametrize(("n", "want"), [(1.0, 1), (1.5, 1), (2.0, 1), (2.9, 1), (3.0, 2), (16.0, 15)])
def test_suggested_workers(n: float, want: int) -> None:
    assert suggested_workers(n) == want


@pytest.mark.parametrize(
    ("cpus", "workers", "cpu_pct", "want"),
    [
        (2.0, 2.0, 63.0, 3),  # recorded random_reads_workers: 1 spare CPU / 0.315 core per worker
        (16.0, 4.0, 40.0, 64),  # 0.1 core per worker: 15 / 0.1 = 150, capped at 4 per CPU
        (8.0, 4.0, 400.0, 7),  # CPU-busy workers: no more than suggested_workers
        (8.0, 8.0, 800.0, 8),  # never below the workers already running
        (4.0, 2.0, 0.0, 16),  # idle workers: floored at 0.05 core each, then capped
        (4.0, 0.0, 0.0, 3),  # no workers: the plain suggestion
    ],
)
def test_io_bound_workers(cpus: float, workers: float, cpu_pct: float, want: int) -> None:
    assert io_bound_workers(cpus, workers, cpu_pct) == want
