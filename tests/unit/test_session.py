"""Session: which training process is diagnosed, and what a missing feature is blamed on."""

from __future__ import annotations

import os

import pytest

from tests.unit import nvml_replay
from tests.unit.hookrecords import hook_record
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.model.readings import HookState, SourceStatus, Status
from torchwatch.sources.nvml import GPM_FIRST_SAMPLE, PROC_NOT_TREE, NvmlSource
from torchwatch.watch.observe import NO_CUDA, NO_HOOK_MEMORY
from torchwatch.watch.session import Session, SessionOptions


@pytest.fixture
def session() -> Session:
    # Built on this test process but never started: no sampler thread runs.
    return Session(os.getpid(), load_rules(), SessionOptions(nvml=False))


def test_busiest_main_is_diagnosed_and_the_choice_is_sticky(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session.tree, "mains", lambda: [100, 200])
    session.proc.cpu_pct = {100: 1.0, 200: 95.0}  # a wrapper waiting on the real training
    assert session.main_pid == 200
    session.proc.cpu_pct = {100: 60.0, 200: 50.0}  # not 2x busier: keep the choice
    assert session.main_pid == 200
    monkeypatch.setattr(session.tree, "mains", lambda: [100])  # the chosen one exited
    assert session.main_pid == 100


def test_no_main_yet(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session.tree, "mains", lambda: [])
    assert session.main_pid is None
    assert "no Python training process" in session.why_missing("data_wait_share")


def test_missing_feature_blames_its_unavailable_source(session: Session) -> None:
    session.pyspy.status = SourceStatus.unavailable("py-spy may not read process 1: permission denied", "sudo")
    assert (
        session.why_missing("data_wait_share") == "py-spy unavailable: py-spy may not read process 1: permission denied"
    )
    assert session.why_missing("main_disk_share").startswith("not enough samples")


def test_gpm_is_a_source_beside_nvml_and_missing_gpu_features_give_its_reason() -> None:
    s = Session(os.getpid(), load_rules(), SessionOptions(nvml=True))
    s.nvml = NvmlSource(list, nvml=nvml_replay.ReplayNvml(nvml_replay.load("nvml_a100_no_gpm")))
    s.sources = [src for src in s.sources if src.name != "nvml"] + [s.nvml]
    s.store.add(s.nvml.sample(1.0))
    statuses = s.statuses()
    assert statuses["nvml"].status is Status.OK
    assert statuses["gpm"].status is Status.UNAVAILABLE
    reason = "GPM needs a Hopper or newer GPU (this is NVIDIA A100-SXM4-40GB)"
    assert statuses["gpm"].reason == reason
    assert s.why_missing("gpu_sm_active_mean") == f"gpm unavailable: {reason}"
    s.nvml.close()


def test_gpu_feature_missing_on_a_gpm_gpu_gives_the_samples_reason() -> None:
    s = Session(os.getpid(), load_rules(), SessionOptions(nvml=False))
    first = nvml_replay.replay(nvml_replay.load("nvml_h100_gpu_bound"), tree={17})[1][0]
    s.store.add([first])
    assert s.why_missing("gpu_sm_active_mean") == GPM_FIRST_SAMPLE
    assert s.why_missing("gpu_proc_sm_pct") == PROC_NOT_TREE


def test_without_nvml_there_is_no_gpm_source(session: Session) -> None:
    assert "gpm" not in session.statuses()


def test_own_usage_reports_cpu_and_memory(session: Session) -> None:
    usage = session.own_usage()
    assert usage.torchwatch_cpu_s > 0 and usage.max_rss_bytes > 1_000_000
    assert usage.pyspy_cpu_s == 0.0


def test_store_window_copies_only_the_kinds_asked_for() -> None:
    from torchwatch.analysis.store import Store
    from torchwatch.model.readings import HookState

    store = Store()
    store.add([HookState(t=1.0, pid=1, steps=0, batches=0, data_wait_s=0.0, in_next_since=0.0)])
    assert len(store.window(0.0, 2.0).hook) == 1
    assert store.window(0.0, 2.0, kinds=("processes",)).hook == []
    assert len(store.window(0.0, 2.0, kinds=("hook",)).hook) == 1


def test_missing_device_memory_says_why_from_the_hooks_record(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session.tree, "mains", lambda: [7])
    assert session.why_missing("cuda_mem_unused_reserved_bytes") == NO_HOOK_MEMORY
    session.store.add([HookState(1.0, 7, 0, 0, 0.0, 0.0, record=hook_record(7, cuda_initialized=False))])
    assert session.why_missing("cuda_mem_peak_ratio") == NO_CUDA
