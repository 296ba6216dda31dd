"""The TUI's pure parts: rows and series from recorded readings, the Observation builder, text, log tailing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.unit import nvml_replay
from tests.unit.hookrecords import hook_record
from tests.unit.recorded import MAIN, NOW, WORKERS, RecordedWatch, observation_of, recorded_session
from torchwatch import wire
from torchwatch.analysis import views as rows
from torchwatch.analysis.features import thread_states
from torchwatch.faces.tui import render, views
from torchwatch.faces.tui.feed import LogTail, Reader
from torchwatch.faces.tui.messages import ObservationRead, ReaderFailed
from torchwatch.hook.summary import load_trace, summarize_trace
from torchwatch.model.observation import Observation, ProcessRow
from torchwatch.model.readings import Frame, HookState, Role, SourceStatus, ThreadSample, Wait
from torchwatch.model.units import fmt_bytes, fmt_mib_per_s, fmt_pct, fmt_share, series_range
from torchwatch.watch.observe import Trends, burst_view, steps_view, target_view

SITE = "/usr/lib/python3.11/site-packages/torch"


def test_process_rows_take_the_last_round_and_average_cpu() -> None:
    store = recorded_session().store
    w = store.window(0, NOW)
    procs = rows.process_rows(w.processes, [th for th in w.threads if th.t >= NOW - 10])
    assert {r.pid for r in procs} == {MAIN, *WORKERS, 4250}
    main = next(r for r in procs if r.pid == MAIN)
    # mean of the samples at t = 57..60 (wobble (i * 37) % 11 for i = 57..60: 8, 1, 5, 9)
    assert main.cpu_pct == pytest.approx(38.0 + (8 + 1 + 5 + 9) / 4)
    assert main.rss_bytes == 960_000_000 and main.role == "main"
    # last thread round of the main process: its main thread waits (sync), one thread on a socket
    assert main.threads == "W2 N1"
    helper = next(r for r in procs if r.pid == 4250)
    assert helper.read_bytes_per_s is None and fmt_mib_per_s(helper.read_bytes_per_s) == "n/a"


def test_sort_rows_biggest_first_and_unknown_last() -> None:
    procs = [
        ProcessRow(1, "main", "a", 10.0, 5, None, "", 1),
        ProcessRow(2, "worker", "b", None, 50, 3.0, "", 1),
        ProcessRow(3, "worker", "c", 90.0, 1, 1.0, "", 1),
    ]
    assert [r.pid for r in views.sort_rows(procs, "cpu")] == [3, 1, 2]
    assert [r.pid for r in views.sort_rows(procs, "rss")] == [2, 1, 3]
    assert [r.pid for r in views.sort_rows(procs, "read")] == [2, 3, 1]
    assert [r.pid for r in views.sort_rows(procs, "pid")] == [1, 2, 3]


def test_stack_rows_split_the_loop_and_the_workers() -> None:
    w = recorded_session().store.window(NOW - 10, NOW)
    stacks = rows.stack_rows(w.stacks, MAIN)
    main = views.category_shares(stacks, "main")
    # the recording's loop: 59 % waiting on workers, the rest in the model and optimizer
    assert next(iter(main)) == "data/queue" and main["data/queue"] == pytest.approx(116 / 196)
    assert {"forward", "backward", "optimizer", "other"} <= set(main)
    assert sum(main.values()) == pytest.approx(1.0)
    workers = views.category_shares(stacks, "worker")
    assert next(iter(workers)) == "fetch"
    fetch = next(r for r in stacks if r.who == "worker" and r.category == "fetch")
    # the worker's hot frame is the dataset below _worker_loop, not the parent's <module> it inherited
    assert (fetch.function, fetch.location) == ("D.__getitem__", "dl.py:7")
    assert stacks == sorted(stacks, key=lambda r: -r.share)


def test_worker_category() -> None:
    loop = Frame("_worker_loop", f"{SITE}/utils/data/_utils/worker.py", 300)
    fetch = Frame("fetch", f"{SITE}/utils/data/_utils/fetch.py", 54)
    get = Frame("get", "/usr/lib/python3.11/multiprocessing/queues.py", 113)
    put = Frame("put", "/usr/lib/python3.11/multiprocessing/queues.py", 90)
    assert rows.worker_category((loop, fetch)) == "fetch"
    assert rows.worker_category((loop, get)) == "idle"
    assert rows.worker_category((loop, put)) == "send"
    assert rows.worker_category((Frame("main", "/x.py", 1),)) == "other"


def test_rows_behind_a_finding_follow_its_evidence() -> None:
    stacks = rows.stack_rows(recorded_session().store.window(NOW - 10, NOW).stacks, MAIN)
    data = views.rows_behind(stacks, ["data_wait_queue_share", "workers_running_fraction"])
    main = {r.category for r in data if r.who == "main"}
    assert "data/queue" in main and {c.partition("/")[0] for c in main} == {"data"}
    assert any(r.who == "worker" for r in data)
    loop = views.rows_behind(stacks, ["loop_cpu_share", "main_cpu_pct"])
    assert {r.category for r in loop} == {"forward", "backward", "optimizer", "other"}
    assert views.rows_behind(stacks, ["gpu_util_mean"]) == stacks  # no phase: everything
    assert views.phases_for(["backward_share"]) == frozenset({"backward"})


def test_state_shares_of_the_loop_and_the_workers() -> None:
    threads = [
        ThreadSample(1.0, MAIN, MAIN, Role.MAIN, True, "S", Wait.SYNC),
        ThreadSample(2.0, MAIN, MAIN, Role.MAIN, True, "R", Wait.RUNNING),
        ThreadSample(2.0, MAIN, MAIN + 1, Role.MAIN, False, "S", Wait.NET),  # not the main thread
        ThreadSample(2.0, 99, 99, Role.MAIN, True, "D", Wait.DISK),  # another training process
        ThreadSample(2.0, 7, 7, Role.WORKER, True, "D", Wait.DISK),
    ]
    main, workers = thread_states(threads, MAIN)
    assert dict(main) == {"sync": 0.5, "running": 0.5}
    assert dict(workers) == {"disk": 1.0}
    assert thread_states([], None) == ((), ())


def test_gpu_card_shows_gpm_readings_or_why_there_are_none() -> None:
    _, h100 = nvml_replay.replay(nvml_replay.load("nvml_h100_launch_bound"))
    (card,) = rows.gpu_rows(h100)
    last = h100[-1]
    assert card.last == last and last.gpm_reason is None
    assert len(card.sm_series) == len(h100) - 1  # the first sample has no GPM interval
    text = render.gpu_card_text(card).plain
    assert f"SM active {last.sm_active_pct:.0f}% · occupancy {last.sm_occupancy_pct:.0f}%" in text
    assert text.rstrip().endswith("(GPM)")
    _, a100 = nvml_replay.replay(nvml_replay.load("nvml_a100_no_gpm"))
    (card,) = rows.gpu_rows(a100)
    assert card.sm_series == ()
    text = render.gpu_card_text(card).plain
    assert "SM activity n/a: GPM needs a Hopper or newer GPU (this is NVIDIA A100-SXM4-40GB)" in text
    assert "SM active" not in text


def test_gpu_cards_and_memory_trend() -> None:
    w = recorded_session(gpus=True).store.window(0, NOW)
    cards = rows.gpu_rows(w.gpus)
    assert [c.index for c in cards] == [0, 1]
    assert cards[0].used_by_target and not cards[1].used_by_target
    assert len(cards[0].util_series) == 60 and cards[0].power_limit_w == 400.0
    mem = rows.memory_trend(w.processes, w.gpus)
    assert len(mem.rss_series) == 60 and mem.rss_bytes == mem.rss_series[-1] == mem.rss_peak_bytes
    assert dict(mem.rss_by_role)["worker"] == 410_000_000 + 415_000_000
    # only the GPU the training uses counts
    assert mem.device_used_bytes == 12_600_000_000 and mem.device_total_bytes == 40_000_000_000
    none = rows.memory_trend([], [])
    assert none.rss_bytes is None and none.device_used_bytes is None


def test_trends_skip_missing_values_replace_same_time_and_stay_bounded() -> None:
    t = Trends(keep=3)
    t.add(1.0, {"a": 1.0, "b": None})
    t.add(1.0, {"a": 2.0})
    assert t.series("a") == (2.0,) and t.series("b") == ()
    for i in range(2, 10):
        t.add(float(i), {"a": float(i)})
    assert t.series("a") == (7.0, 8.0, 9.0)


def test_bar_widths_fill_the_width_by_largest_remainder() -> None:
    shares = {"kernel": 0.5, "memcpy": 0.25, "other": 0.25, "memset": 0.0}
    assert views.bar_widths(shares, 10) == [("kernel", 5), ("memcpy", 3), ("other", 2)] or views.bar_widths(
        shares, 10
    ) == [("kernel", 5), ("memcpy", 2), ("other", 3)]
    assert sum(n for _, n in views.bar_widths({"a": 1, "b": 1, "c": 1}, 80)) == 80
    assert views.bar_widths({"kernel": 0.0}, 10) == []
    assert views.bar_widths({"kernel": 0.999, "other": 0.001}, 10) == [("kernel", 10)]


def test_units() -> None:
    # one unit system for bytes, binary (the old TUI's decimal values in the comments)
    assert fmt_bytes(None) == "n/a"
    assert fmt_bytes(1_500_000_000) == "1.4 GiB"  # 1.5 GB
    assert fmt_bytes(412_000_000) == "393 MiB"  # 412 MB
    assert fmt_share(0.625) == "62%" and fmt_pct(None) == "n/a"
    assert views.ellipsize("abcdef", 4) == "abc…" and views.ellipsize("ab", 4) == "ab"
    assert series_range([30.0, 55.0]) == "30–55"
    assert series_range([1.7e9, 1.8e9], "bytes") == "1.6–1.7 GiB"  # 1.7–1.8 GB
    assert series_range([9e8, 1.2e9], "bytes") == "0.8–1.1 GiB"  # 0.9–1.2 GB
    assert series_range([5e8, 5e8], "bytes") == "477 MiB" and series_range([0.0, 0.0]) == "0"  # 500 MB


def test_observation_without_a_hook() -> None:
    session = recorded_session()
    obs = session.observe()
    assert session.analysis is not None and obs.verdict is session.analysis.verdict and obs.target.exited is None
    steps = obs.focus.steps
    assert steps.status is None and steps.data_wait_source == "py-spy"
    assert not obs.focus.burst.possible and "torchwatch run" in obs.focus.burst.reason
    assert obs.gpu_note is not None and obs.gpu_note.startswith("n/a: NVML library not found")
    assert "install the NVIDIA driver" in obs.gpu_note
    state, share = obs.focus.main_states[0]
    assert len(obs.processes) == 4 and state == "sync" and share == pytest.approx(29 / 41)
    assert obs.focus.device_memory.allocated_bytes is None and "no hook" in (obs.focus.device_memory.why or "")


def test_observation_of_a_hooked_training() -> None:
    session = recorded_session(hooked=True, gpus=True)
    obs = session.observe()
    steps = obs.focus.steps
    assert steps.status == "ok" and steps.steps_per_s == 3.2 and steps.data_wait_source == "hook"
    assert steps.loader is not None and steps.loader.num_workers == 2
    assert "batch=1.5 MiB" in render.steps_text(obs).plain  # 1_572_864 bytes (the old "2 MB")
    assert steps.amp_text == "no autocast seen"
    assert session.trends.series("steps_per_s") == (3.2,) and session.trends.series("data_wait_pct") == (62.0,)
    burst = obs.focus.burst
    assert burst.possible and burst.last is not None
    assert burst.last.breakdown_share[0] == ("kernel", 0.08) and burst.last.top_kernels[0].calls == 40
    assert obs.gpu_note is None and len(obs.gpus) == 2


def test_burst_view_states_and_errors() -> None:
    rec = hook_record(MAIN, burst={"state": "running", "last": {"id": 1, "error": "another profiler is active"}})
    view = burst_view(rec, (True, "ok"))
    assert not view.possible and view.reason == "a burst is running" and view.error == "another profiler is active"
    assert "last burst failed: another profiler is active" in render.burst_text(view).plain
    empty = burst_view(None, (False, "PID 123 does not catch SIGUSR2"))
    assert "PID 123 does not catch SIGUSR2" in render.burst_text(empty).plain


def test_steps_from_the_hooks_reading_and_the_analysis() -> None:
    features: dict[str, float | None] = {
        "hook_steps_per_s": 2.5,
        "step_time_p50_ms": 400.0,
        "dl_num_workers": 4.0,
        "dl_pin_memory": 1.0,
        "data_wait_fraction": 0.3,
        "amp_enabled": 1.0,
    }
    rec = hook_record(
        MAIN, torch="2.13.0", amp={"autocast": True}, dataloaders=[{"num_workers": 4, "pin_memory": True}]
    )
    reading = HookState(t=1.0, pid=MAIN, steps=10, batches=10, data_wait_s=0.3, in_next_since=0.0, record=rec)
    view = steps_view(reading, SourceStatus.ok(), features, 0.0)
    assert view.status == "ok" and view.steps_per_s == 2.5 and view.data_wait_source == "hook"
    assert view.loader is not None and view.loader.num_workers == 4 and view.loader.pin_memory is True
    text = render.steps_text(observation_of(features, reading, SourceStatus.ok())).plain
    assert "2.50 steps/s" in text and "num_workers=4" in text and "pin_memory=True" in text
    assert "AMP autocast on" in text


def test_storage_line_shows_the_disk_and_swap_readings() -> None:
    disk: dict[str, float | None] = {
        "disk_read_bytes_per_s": 78 * 2**20,
        "disk_read_request_bytes": 4096.0,
        "disk_read_await_ms": 0.065,
        "disk_read_queue": 1.77,
        "disk_busy_share": 0.72,
    }
    line = "disk reads 78.0 MiB/s · 4.0 KiB per request · 0.07 ms each · 1.8 in flight · busy 72%"
    assert render.storage_line(disk) == line
    assert line in render.steps_text(observation_of(disk)).plain
    swapping = render.storage_line({"swap_in_bytes_per_s": 30e6, "memory_pressure_pct": 41.0})
    assert swapping == "swap-in 28.6 MiB/s · memory stalls 41%"
    # too few requests for a size (reads served from the page cache), nothing swapped in
    quiet = {"disk_read_bytes_per_s": 1e5, "disk_read_request_bytes": None, "swap_in_bytes_per_s": 0.0}
    assert render.storage_line(quiet) is None


def test_hook_unavailable_says_why() -> None:
    obs = observation_of({}, hook=SourceStatus.unavailable("PID 9 has no hook"))
    assert "steps: n/a: PID 9 has no hook" in render.steps_text(obs).plain


class _Child:
    def __init__(self, code: int | None) -> None:
        self.code = code
        self.pid = 5
        self.args = ("python", "train.py")

    def poll(self) -> int | None:
        return self.code


@pytest.mark.parametrize(("code", "shown"), [(0, "status 0"), (3, "status 3"), (-2, "status 130")])
def test_exit_line_gives_the_shell_status(code: int, shown: str) -> None:
    target = target_view(1, (), _Child(code), False)
    assert target.exited is not None and shown in target.exited and target.exit_code == int(shown.split()[-1])
    running = target_view(1, (), _Child(None), False)
    assert (running.exited, running.exit_code) == (None, None)
    assert "status unknown" in (target_view(1, ("python",), None, True).exited or "")


def test_a_failing_read_does_not_stop_the_refreshes() -> None:
    posted: list[Any] = []
    calls = [0]
    good = recorded_session().observe()

    def read() -> Observation:
        calls[0] += 1
        if calls[0] <= 2:
            raise RuntimeError("boom")
        return good

    reader = Reader(read, lambda m: posted.append(m) or True, 1.0)
    for _ in range(3):
        reader.read_once()
    failed = [m for m in posted if isinstance(m, ReaderFailed)]
    assert len(failed) == 1 and "boom" in failed[0].error  # said once, not at every refresh
    assert isinstance(posted[-1], ObservationRead) and posted[-1].observation is good


def test_exited_target_shows_the_last_verdict_and_its_last_readings() -> None:
    base = recorded_session()
    session = RecordedWatch(store=base.store, analysis=base.analysis, gone=True, ended_at=NOW, now=NOW + 100.0)
    session.sources["psutil"] = SourceStatus.gone()
    obs = session.observe()  # long after the exit
    assert base.analysis is not None and obs.verdict is base.analysis.verdict and obs.target.exited is not None
    assert len(obs.processes) == 4  # readings end where the target ended


def test_verdict_and_finding_text() -> None:
    session = recorded_session()
    obs = session.observe()
    text = render.verdict_text(obs).plain
    assert text.startswith("dataloader-bound  confidence 0.95")
    assert "workers 2" in text and "GPU n/a" in text
    assert render.verdict_text(None).plain.startswith("starting")
    finding = obs.findings[0]
    table = render.evidence_table(finding, obs)
    assert table.row_count == len(finding.evidence)


def test_log_tail_reads_complete_lines_and_bounds_each_read(tmp_path: Path) -> None:
    path = tmp_path / "training.log"
    tail = LogTail(path, chunk=64)
    assert tail.read_new() == []  # not there yet
    path.write_bytes(b"one\ntw")
    assert tail.read_new() == ["one"]
    with open(path, "ab") as f:
        f.write(b"o\nprogress 10%\rprogress 90%\n")
    assert tail.read_new() == ["two", "progress 90%"]
    with open(path, "ab") as f:
        f.write(b"x" * 200 + b"\nlast\n")
    lines = tail.read_new()
    assert lines[0].startswith("[torchwatch:") and "skipped" in lines[0] and lines[-1] == "last"
    path.write_bytes(b"new file\n")  # truncated and rewritten
    os.utime(path)
    assert tail.read_new() == ["new file"]


def test_burst_panel_gives_the_host_wait_part_of_gpu_idle() -> None:
    trace = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "trace_partly_idle.json.gz"
    summary = summarize_trace(load_trace(trace))
    last = wire.BurstResult.decode({**summary, "id": 4}, "summary")  # as the reader decodes hook.json
    host_wait = dict(last.gpu_idle_split_share)["host_wait"]
    assert host_wait == summary["gpu_idle_split_share"]["host_wait"]
    view = burst_view(hook_record(MAIN, burst={"last": {**summary, "id": 4}}), (True, "b asks for a burst"))
    text = render.burst_text(view).plain
    assert f"GPU idle {summary['gpu_idle_share']:.0%} (host wait {host_wait:.0%})" in text
