"""Session: which training process is diagnosed, and what a missing feature is blamed on."""

from __future__ import annotations

import inspect
import logging
import os
import signal
import subprocess
import threading
import time
from typing import Any

import pytest

from tests.unit import nvml_replay
from tests.unit.hookrecords import hook_record
from torchwatch.analysis.diagnosis import Analysis
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.faces.tui.app import Watched
from torchwatch.model.findings import Finding, Verdict
from torchwatch.model.observation import Observation, RankReading
from torchwatch.model.readings import HookState, Role, SourceStatus, Status
from torchwatch.sources import FocusedSource
from torchwatch.sources.nvml import GPM_FIRST_SAMPLE, PROC_NOT_TREE, NvmlSource
from torchwatch.sources.proc import TreeNode
from torchwatch.watch.cadence import SETTLE_EVALUATIONS, CadenceReading
from torchwatch.watch.observe import NO_CUDA, NO_HOOK_MEMORY
from torchwatch.watch.session import Session, SessionOptions


def _named(session: Session, name: str) -> Any:
    """The session's source named ``name`` (its concrete class: the test reads its knobs)."""
    src = session.sources.get(name)
    assert src is not None, name
    return src


@pytest.fixture
def session() -> Session:
    # Built on this test process but never started: no sampler thread runs.
    return Session(os.getpid(), load_rules(), SessionOptions(nvml=False))


def test_busiest_main_is_diagnosed_and_the_choice_is_sticky(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session.tree, "mains", lambda: [100, 200])
    session.sources.tree_source.cpu_pct = {100: 1.0, 200: 95.0}  # a wrapper waiting on the real training
    assert session.focus_pid == 200
    session.sources.tree_source.cpu_pct = {100: 60.0, 200: 50.0}  # not 2x busier: keep the choice
    assert session.focus_pid == 200
    monkeypatch.setattr(session.tree, "mains", lambda: [100])  # the chosen one exited
    assert session.focus_pid == 100


def test_the_rank_chosen_in_the_tui_is_the_focus(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session.tree, "mains", lambda: [100, 101])
    session.sources.tree_source.cpu_pct = {100: 1.0, 101: 1.0}
    session._focus.judged(
        (RankReading(0, 100, 2, 20, 90.0, 9.0, 9.0, 9.0), RankReading(1, 101, 2, 20, 90.0, 9.0, 9.0, 0.0)), None
    )
    assert session.focus_pid == 100  # the lowest rank
    session.choose_rank(1)
    assert session.focus_pid == 101
    session.choose_rank(None)
    assert session.focus_pid == 100


class _Focused(FocusedSource):
    """A source that reads the focus process: records the focus it is handed."""

    name = "focused"

    def __init__(self) -> None:
        self.interval, self.status = 0.5, SourceStatus.ok()
        self.focus: list[int | None] = []

    def sample(self, now: float, focus: int | None) -> list[object]:
        self.focus.append(focus)
        return []

    def close(self) -> None:
        pass


def test_py_spy_and_the_hook_are_handed_the_focus_of_each_read(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    pyspy, threads = _named(session, "py-spy"), _named(session, "threads")
    assert isinstance(pyspy, FocusedSource) and isinstance(session.sources.channel, FocusedSource)
    assert not isinstance(session.sources.tree_source, FocusedSource) and not isinstance(threads, FocusedSource)
    src, plain = _Focused(), _Ticker("plain", 0.1)
    mains = [200]
    monkeypatch.setattr(session.tree, "mains", lambda: mains)
    for pids in ([200], [], [300]):
        mains[:] = pids
        assert session._sample(src) and session._sample(plain)
    assert src.focus == [200, None, 300] and len(plain.reads) == 3


def test_each_tick_hands_its_observation_to_the_consumers(session: Session, caplog: pytest.LogCaptureFixture) -> None:
    got: list[Observation] = []

    def broken(obs: Observation) -> None:
        raise RuntimeError("consumer broke")

    session.subscribe(broken)
    session.subscribe(got.append)
    with caplog.at_level(logging.WARNING, logger="torchwatch.watch.session"):
        session.analyze()
        session.analyze()
    assert len(got) == 2 and got[-1] is session.latest_observation  # a failing consumer stops no other
    assert caplog.text.count("RuntimeError: consumer broke") == 1  # warned once, as every analysis error


def test_a_session_is_everything_the_tui_watches() -> None:
    """The TUI calls these five and probes nothing (faces/tui/app.py's ``Watched``)."""
    members = [m for m in vars(Watched) if not m.startswith("_") and callable(getattr(Watched, m))]
    assert sorted(members) == ["choose_rank", "observe", "request_burst", "try_setting", "wake"]
    for name in members:
        wanted = inspect.signature(getattr(Watched, name)).parameters
        have = inspect.signature(getattr(Session, name)).parameters
        assert list(have)[: len(wanted)] == list(wanted), name
        assert all(p.default is not inspect.Parameter.empty for p in list(have.values())[len(wanted) :]), name


def test_no_main_yet(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session.tree, "mains", lambda: [])
    assert session.focus_pid is None
    assert "no Python training process" in session.why_missing("data_wait_share")


def test_missing_feature_blames_its_unavailable_source(session: Session) -> None:
    pyspy = _named(session, "py-spy")
    pyspy.status = SourceStatus.unavailable("py-spy may not read process 1: permission denied", "sudo")
    assert (
        session.why_missing("data_wait_share") == "py-spy unavailable: py-spy may not read process 1: permission denied"
    )
    assert session.why_missing("main_disk_share").startswith("not enough samples")


def test_gpm_is_a_source_beside_nvml_and_missing_gpu_features_give_its_reason() -> None:
    s = Session(os.getpid(), load_rules(), SessionOptions(nvml=True))
    nvml = NvmlSource(list, nvml=nvml_replay.ReplayNvml(nvml_replay.load("nvml_a100_no_gpm")))
    s.sources.entries = [(spec, nvml if src.name == "nvml" else src) for spec, src in s.sources.entries]
    s.store.add(nvml.sample(1.0))
    statuses = s.statuses()
    assert statuses["nvml"].status is Status.OK
    assert statuses["gpm"].status is Status.UNAVAILABLE
    reason = "GPM needs a Hopper or newer GPU (this is NVIDIA A100-SXM4-40GB)"
    assert statuses["gpm"].reason == reason
    assert s.why_missing("gpu_sm_active_mean") == f"gpm unavailable: {reason}"
    nvml.close()


def test_gpu_feature_missing_on_a_gpm_gpu_gives_the_samples_reason() -> None:
    s = Session(os.getpid(), load_rules(), SessionOptions(nvml=False))
    first = nvml_replay.replay(nvml_replay.load("nvml_h200_gpu_bound"), tree={17})[1][0]
    s.store.add([first])
    assert s.why_missing("gpu_sm_active_mean") == GPM_FIRST_SAMPLE
    assert s.why_missing("gpu_proc_sm_pct") == PROC_NOT_TREE


def test_without_nvml_there_is_no_gpm_source(session: Session) -> None:
    assert "gpm" not in session.statuses()


def test_own_usage_reports_cpu_and_memory(session: Session) -> None:
    usage = session.own_usage()
    assert usage.torchwatch_cpu_s > 0 and usage.max_rss_bytes > 1_000_000
    assert usage.pyspy_cpu_s == 0.0


def _burn(seconds: float) -> list[object]:
    """Spend ``seconds`` of this thread's CPU; no readings."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return []


def test_own_usage_charges_each_reading_and_analysis_to_its_part(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    psutil_src = _named(session, "psutil")
    monkeypatch.setattr(session, "read", lambda src, now: _burn(0.05))
    monkeypatch.setattr(session, "analyze", lambda: _burn(0.03))
    _burn(0.01)  # the "other" part: not inside a reading or an analysis
    assert session._sample(psutil_src)
    session._analysis_round()
    usage = session.own_usage()
    parts = usage.by_part
    assert parts is not None
    assert parts["psutil"] >= 0.05 and parts["analysis"] >= 0.03
    assert parts["start"] > 0  # this test process's CPU before the session was built
    assert "threads" not in parts  # never read
    # the parts split torchwatch's CPU (each rounded to 1 ms)
    assert abs(sum(parts.values()) - usage.torchwatch_cpu_s) <= 0.001 * len(parts) + 0.002


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


def _settle(s: Session) -> None:
    """Hand the session's pacer readings of one settled verdict until it goes steady."""
    reading = CadenceReading(label="cpu-bound", top_finding="loop-cpu", confidence=0.9, processes=(1, 0))
    for _ in range(SETTLE_EVALUATIONS):
        s.pacer.update(reading)


def test_the_steady_cadence_slows_every_sampler_and_a_wake_restores_them(session: Session) -> None:
    pyspy, threads = _named(session, "py-spy"), _named(session, "threads")
    proc, hook = session.sources.tree_source, session.sources.channel
    fast = (pyspy.rate, pyspy.chunk, threads.interval, proc.interval)
    assert session.pacer.view().mode == "fast"
    _settle(session)
    view = session.pacer.view()
    assert view.mode == "steady" and [c.mode for c in view.changes] == ["steady"]
    assert pyspy.rate < fast[0] and pyspy.chunk > fast[1]
    assert threads.interval > fast[2] and threads.all_interval > 1.0
    assert proc.interval > fast[3] and hook.interval > 0.5
    assert session.observe().sampling.mode == "steady"
    session.wake("a key was pressed in the TUI")
    assert (pyspy.rate, pyspy.chunk, threads.interval, proc.interval) == fast
    view = session.pacer.view()
    assert view.mode == "fast" and view.returns_to_fast == 1 and view.reason == "a key was pressed in the TUI"
    assert view.steady_s >= 0.0 and [c.mode for c in view.changes] == ["steady", "fast"]


@pytest.mark.parametrize(("adaptive", "mode"), [(True, "steady"), (False, "fast")])
def test_each_analysis_feeds_the_policy_unless_adaptive_is_off(
    adaptive: bool, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Session(os.getpid(), load_rules(), SessionOptions(nvml=False, adaptive=adaptive))
    reading = CadenceReading(label="cpu-bound", top_finding="loop-cpu", confidence=0.9)
    monkeypatch.setattr(s, "_cadence_reading", lambda analysis, focus, now: reading)
    for _ in range(SETTLE_EVALUATIONS):
        s.analyze()
    assert s.pacer.view().mode == mode
    assert s.observe().sampling.mode == mode
    if not adaptive:
        assert s.pacer.view().reason == "adaptive cadence off"


def test_going_fast_wakes_napping_samplers_and_cuts_a_slow_py_spy_chunk_short(session: Session) -> None:
    _settle(session)
    chunk = subprocess.Popen(["sleep", "30"])  # stands for a running steady py-spy chunk
    _named(session, "py-spy")._proc = chunk  # type: ignore[assignment]
    napped: list[float] = []

    def nap() -> None:
        t0 = time.monotonic()
        session._sleep(20.0)
        napped.append(time.monotonic() - t0)

    sleeper = threading.Thread(target=nap)
    sleeper.start()
    time.sleep(0.2)
    session.request_burst()  # no training process: refused, but the cadence goes fast first
    # Margins: measured beside one busy process on 2 CPUs (20 runs), the nap ended 14 ms and the
    # chunk 17 ms after the request (25 ms beside three); 5 s is hundreds of times that. Its CI
    # failure was no load: the suite ran with SIGINT ignored, which `sleep` inherited (30 s).
    sleeper.join(5)
    assert napped and napped[0] < 5.0
    assert chunk.wait(5) == -signal.SIGINT
    assert session.pacer.view().reason == "a profiler burst was asked for"


def test_the_policy_reads_the_verdict_its_finding_the_loop_and_the_tree(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = {
        pid: TreeNode(pid, 1, role, "python", ("python",), 0.0)
        for pid, role in ((100, Role.LAUNCHER), (200, Role.MAIN), (201, Role.WORKER), (202, Role.WORKER))
    }
    monkeypatch.setattr(session.tree, "nodes", lambda: nodes)
    info = Finding("loop-sleeps", "undetermined", "info", "sleeps", 0.1, {}, (), "")
    win = Finding("loop-cpu", "cpu-bound", "critical", "The loop computes.", 0.8, {}, (), "")
    analysis = Analysis(
        t=1.0,
        features={"step_time_p50_ms": 250.0, "hook_steps_per_s": 4.0, "data_wait_fraction": 0.3},
        findings=[info, win],
        verdict=Verdict("cpu-bound", 0.9, "The loop computes."),
    )

    def read(a: Analysis) -> CadenceReading:
        return session._cadence_reading(a, None, time.monotonic())

    session.sources.channel.status = SourceStatus.ok()
    r = read(analysis)
    assert (r.label, r.top_finding, r.confidence) == ("cpu-bound", "loop-cpu", 0.9)
    assert r.step_time_s == 0.25 and r.steps == 40.0 and r.data_wait == 0.3
    assert r.processes == (1, 2) and r.straggler is None and not r.collecting
    # a verdict made before the training steps (importing torch, its hook not stepping yet)
    idle = Verdict("undetermined", 0.3, "No resource is seen limiting the loop.")
    session.sources.channel.status = SourceStatus(Status.STARTING, "waiting for the training to import torch")
    assert read(Analysis(t=3.0, features={}, verdict=idle)).collecting
    session.sources.channel.status = SourceStatus.ok()
    assert read(Analysis(t=3.0, features={"hook_steps_per_s": 0.0}, verdict=idle)).collecting
    assert not read(Analysis(t=3.0, features={"hook_steps_per_s": 2.0}, verdict=idle)).collecting


def test_the_cadence_waits_until_the_window_is_all_steps(session: Session) -> None:
    """A window that reaches back before the training's first step still climbs (its data wait
    share above all): the verdict it gives is filling, and settles only once a window has
    passed since the first step."""
    session.sources.channel.status = SourceStatus.ok()
    stepping = Analysis(
        t=3.0, features={"hook_steps_per_s": 4.0}, verdict=Verdict("cpu-bound", 0.9, "The loop computes.")
    )
    now = time.monotonic()
    window = session.options.window_s
    session.store.add([HookState(t=now, pid=200, steps=8, batches=8, data_wait_s=0.0, in_next_since=0.0,
                                 first_step_t=now - window / 2)])  # fmt: skip
    assert session._cadence_reading(stepping, 200, now).filling
    session.store.add([HookState(t=now + 0.1, pid=200, steps=9, batches=9, data_wait_s=0.0, in_next_since=0.0,
                                 first_step_t=now - window - 1.0)])  # fmt: skip
    assert not session._cadence_reading(stepping, 200, now).filling
    # another process's hook (a rank that is not the focus) says nothing of the focus
    session.store.add([HookState(t=now + 0.2, pid=201, steps=1, batches=1, data_wait_s=0.0, in_next_since=0.0,
                                 first_step_t=now)])  # fmt: skip
    assert not session._cadence_reading(stepping, 200, now).filling
    assert session._cadence_reading(stepping, 201, now).filling  # the focus given is the one read


def test_the_rules_run_on_the_ticks_of_the_analysis_interval(session: Session) -> None:
    """Fast: on each whole second; steady: on every other one (the samplers' grid)."""
    for now in (100.0, 100.5, 100.995, 101.01):
        wake = now + session.until_analysis(now)
        assert wake == pytest.approx(round(wake), abs=1e-6)
        assert 0.5 <= wake - now <= 1.5
    _settle(session)
    interval = session.pacer.cadence.analysis_interval_s
    assert interval == 2.0
    wake = 101.3 + session.until_analysis(101.3)
    assert wake / interval == pytest.approx(round(wake / interval), abs=1e-6)


class _Ticker:
    """A source that records when, and on which thread, it was read; ``fail_at``: raise on that read."""

    def __init__(self, name: str, interval: float, fail_at: int | None = None) -> None:
        self.name, self.interval, self.fail_at = name, interval, fail_at
        self.status = SourceStatus.ok()
        self.reads: list[tuple[float, int]] = []

    def sample(self, now: float) -> list[object]:
        self.reads.append((now, threading.get_ident()))
        if self.fail_at is not None and len(self.reads) == self.fail_at:
            raise RuntimeError("broken reader")
        return []

    def close(self) -> None:
        pass


def test_the_quick_sources_and_the_rules_share_one_thread_and_one_grid(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    fine, slow, broken = _Ticker("fine", 0.1), _Ticker("slow", 0.5), _Ticker("broken", 0.1, fail_at=3)
    analyses: list[tuple[float, int]] = []
    monkeypatch.setattr(session, "analyze", lambda now=None: analyses.append((time.monotonic(), threading.get_ident())))
    thread = threading.Thread(target=session._tick_loop, args=([fine, slow, broken],))
    thread.start()
    time.sleep(2.3)
    session._stop.set()
    session.pacer.interrupt()
    thread.join(5)
    assert not thread.is_alive()
    assert {ident for _, ident in fine.reads + slow.reads + analyses} == {thread.ident}
    # after the first round (at once), every read falls on a multiple of its interval (a loaded
    # machine may wake late: 40 ms of slack)
    for src in (fine, slow):
        assert len(src.reads) >= 2.3 / src.interval / 2
        for t, _ in src.reads[1:]:
            assert abs(t / src.interval - round(t / src.interval)) * src.interval < 0.04, (src.name, t)
    assert 1 <= len(analyses) <= 3  # 1 s ticks in 2.3 s
    assert all(abs(t - round(t)) < 0.05 for t, _ in analyses)
    # a source that raised was read no more; the others went on
    assert len(broken.reads) == 3 and broken.status.status is Status.UNAVAILABLE
    assert fine.reads[-1][0] > broken.reads[-1][0] + 0.5
