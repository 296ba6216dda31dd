"""The live app driven by Textual's Pilot over recorded readings: keys, drill-down, focus, exits."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Log, Static, TabbedContent

from tests.unit.recorded import MAIN, NOW, RecordedWatch, recorded_record, recorded_session
from tests.unit.render import FakeChild, plain, run
from torchwatch import wire
from torchwatch.faces import report
from torchwatch.faces.tui.app import WatchApp
from torchwatch.faces.tui.messages import LogRead, ObservationRead
from torchwatch.faces.tui.screens import EvidenceScreen, HelpScreen, QuitScreen, StackScreen
from torchwatch.faces.tui.widgets import FindingsList, GpuPanel, ProcessTable, StackTable, StepsPanel, Trend
from torchwatch.model.observation import ProcessRow, SamplingView
from torchwatch.model.readings import HookState, SourceStatus, Status


def text_of(app: WatchApp, selector: str) -> str:
    return plain(app.screen.query_one(selector, Static).content)


def test_verdict_first_with_the_top_fix_and_sources() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        verdict = text_of(app, "#verdict")
        assert verdict.startswith("dataloader-bound  confidence 0.95")
        assert "2 DataLoader workers take 80% of the training's CPU" in verdict
        assert app.query_one("#verdict").has_class("dataloader-bound")
        findings = app.query_one(FindingsList)
        assert findings.has_focus and findings.option_count == 2
        first = plain(findings.get_option_at_index(0).prompt)
        assert "loader-cpu-contention → dataloader-bound" in first and "fix" in first and "evidence" in first
        assert "nvml unavailable: NVML library not found" in text_of(app, "#sources")

    run(recorded_session(), check)


def test_starting_then_live_update_from_the_reader_thread() -> None:
    recorded = recorded_session()
    session = RecordedWatch(store=recorded.store)

    async def check(app: WatchApp, pilot: Any) -> None:
        assert text_of(app, "#verdict").startswith("starting")
        assert "No finding yet" in plain(app.query_one(FindingsList).get_option_at_index(0).prompt)
        session.analysis = recorded.analysis  # the reader thread picks it up on its own
        for _ in range(100):
            await pilot.pause(0.02)
            if "dataloader-bound" in text_of(app, "#verdict"):
                break
        assert text_of(app, "#verdict").startswith("dataloader-bound")

    app = run(session, check, refresh_s=0.02)
    assert app._reader is not None and not app._reader.is_alive()  # joined on unmount


def test_enter_drills_into_the_evidence_and_escape_comes_back() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("down", "enter")  # the second finding: loader-cpu-in-workers
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, EvidenceScreen) and screen.rule == "loader-cpu-in-workers"
        table = text_of(app, "#ev-table")
        assert "data_wait_queue_share" in table and "59%" in table and "waiting on DataLoader worker" in table
        states = text_of(app, "#ev-states")
        assert "loop thread (/proc, 10 Hz): sync 71% · running 29%" in states
        assert "worker 4280 85% CPU 396 MiB" in states  # 415 MB
        stacks = screen.query_one(StackTable)
        assert {r.category for r in stacks.stack_rows} >= {"data/queue", "fetch"}
        assert "forward" not in {r.category for r in stacks.stack_rows}  # only the stacks behind it
        assert "D.__getitem__" in text_of(app, "#ev-frames")  # the highlighted row's stack
        await pilot.press("tab", "down")
        assert stacks.has_focus and "_BaseDataLoaderIter.__next__" in text_of(app, "#ev-frames")
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, EvidenceScreen)

    run(recorded_session(), check)


def test_panels_by_tab_arrows_and_numbers_and_sortable_processes() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        tabs = app.query_one(TabbedContent)
        assert tabs.active == "processes"  # NVML unavailable: the processes panel comes first
        await pilot.press("right")
        assert tabs.active == "stacks"
        await pilot.press("left", "left")
        assert tabs.active == "gpu"
        assert "n/a: NVML library not found (no NVIDIA driver)" in text_of(app, "#gpu-note")
        await pilot.press("2")
        assert tabs.active == "processes"
        await pilot.press("tab")  # findings → tab bar
        await pilot.press("tab")  # → the panel's table
        table = app.query_one(ProcessTable)
        assert table.has_focus
        assert [r.key.value for r in table.ordered_rows][:2] == ["4280", "4279"]  # by CPU
        await pilot.press("s")  # by RSS
        assert table.sort_key == "rss" and table.ordered_rows[0].key.value == str(MAIN)
        await pilot.press("s", "s")  # by PID
        assert [r.key.value for r in table.ordered_rows] == ["4236", "4250", "4279", "4280"]
        # the cursor stays on its process across sorts and refreshes
        assert table.ordered_rows[table.cursor_row].key.value == "4280"
        await pilot.press("up", "up")
        assert table.cursor_row == 1
        await pilot.press("shift+tab", "shift+tab")
        assert app.query_one(FindingsList).has_focus

    run(recorded_session(), check)


def test_updated_cells_widen_their_column() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        table = app.query_one(ProcessTable)
        row = ProcessRow(1, "main", "python", 5.0, 512, 0.0, "R1", 1)
        table.processes = (row,)
        await pilot.pause()
        wider = dataclasses.replace(row, rss_bytes=1_234_567_000_000)  # same row, wider text
        table.processes = (wider,)
        await pilot.pause()
        assert str(table.get_cell("1", "rss")) == "1.1 TiB"  # wider than "512 B"
        assert table.columns["rss"].content_width >= len("1.1 TiB")  # type: ignore[index]

    run(recorded_session(), check)


def test_stack_row_shows_its_whole_stack() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("3", "tab", "tab")
        assert app.query_one(StackTable).has_focus
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, StackScreen) and app.screen.row.who == "worker"
        await pilot.press("escape")

    run(recorded_session(), check)


def test_without_hook_burst_is_greyed_out_and_says_why() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        assert app.check_action("burst", ()) is None  # shown, disabled
        await pilot.press("b")
        await pilot.pause()
        messages = [n.message for n in app._notifications]
        assert any("burst unavailable: no hook in the process" in m for m in messages)
        await pilot.press("4")
        steps = plain(app.query_one(StepsPanel).query_one("#steps-text", Static).content)
        assert "steps: n/a: no hook in the process" in steps and "data wait 63% (py-spy estimate)" in steps

    run(recorded_session(), check)


def test_with_hook_b_requests_a_burst_and_shows_the_last_one() -> None:
    session = recorded_session(hooked=True)

    async def check(app: WatchApp, pilot: Any) -> None:
        assert app.check_action("burst", ()) is True
        await pilot.press("b")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert session.burst_requests == 1
        assert app.query_one(TabbedContent).active == "burst"
        assert any("SIGUSR2 sent" in n.message for n in app._notifications)
        burst = text_of(app, "#burst-text")
        assert "burst #3: 5 steps · 312.5 ms/step · GPU idle 71%" in burst
        assert "trace: /tmp/torchwatch-0/4236/burst-3.pt.trace.json" in burst
        assert "dataloader 61%" in plain(app.query_one("#burst-bar").render())
        ops = app.query_one("#burst-ops")
        assert ops.row_count == 2  # type: ignore[attr-defined]
        # a burst in flight greys b out again
        last = session.store.latest(HookState)
        assert last is not None and last.record is not None and last.record.burst is not None
        running = dataclasses.replace(last.record.burst, state="running")
        session.store.add([dataclasses.replace(last, record=dataclasses.replace(last.record, burst=running))])
        # the app's reader thread may still deliver an Observation it built before the add (once
        # under load in CI): the next ones read the store as it is now, so b greys out within a few
        for _ in range(50):
            app.refresh_view()
            await pilot.pause(0.05)
            if app.check_action("burst", ()) is None:
                break
        assert app.check_action("burst", ()) is None

    run(session, check)


def test_t_tries_the_highlighted_finding_s_live_fix_and_says_what_it_bought() -> None:
    session = recorded_session(hooked=True)
    # the recording's machine is full (no more workers suggested): give its second finding a live fix
    first, second = session.analysis.findings[:2]
    fix = dataclasses.replace(second.fixes[0], trial="num_workers=3")
    session.analysis.findings[1] = dataclasses.replace(second, fixes=(fix, *second.fixes[1:]))
    assert not any(fx.trial for fx in first.fixes)

    async def check(app: WatchApp, pilot: Any) -> None:
        assert app.observation is not None
        findings = app.observation.findings
        live = [i for i, f in enumerate(findings) if any(fx.trial for fx in f.fixes)]
        assert live == [1], [f.rule for f in findings]
        dead = [i for i in range(len(findings)) if i not in live]
        if dead:  # a finding with no live fix: t says why
            app.query_one(FindingsList).highlighted = dead[0]
            await pilot.pause()
            assert app.check_action("trial", ()) is None
            await pilot.press("t")
            await pilot.pause()
            assert any("can be tried live" in n.message for n in app._notifications)
        app.query_one(FindingsList).highlighted = live[0]
        await pilot.pause()
        fix = next(fx for fx in findings[live[0]].fixes if fx.trial)
        assert app.check_action("trial", ()) is True
        shown = " ".join(plain(app.query_one(FindingsList).get_option_at_index(live[0]).prompt, 400).split())
        assert f"[t: try {fix.trial} live]" in shown
        await pilot.press("t")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert session.trials == [fix.trial]
        assert any("1.50x faster steps" in n.message for n in app._notifications), [
            n.message for n in app._notifications
        ]

    run(session, check)


def test_nvml_available_shows_a_card_per_gpu() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        assert app.query_one(TabbedContent).active == "gpu"
        cards = app.query_one(GpuPanel).query(".gpu-text")
        assert len(cards) == 2
        first = plain(cards.first(Static).content)
        assert "GPU 0 NVIDIA A100-SXM4-40GB  (used by the training)" in first
        assert "power 171 / 400 W (43%)" in first and "memory 11.7 GiB / 37.3 GiB" in first  # 12.6 GB / 40.0 GB
        assert "util 51% (training 51%)" in first
        assert "SM activity n/a: GPM needs a Hopper or newer GPU (this is NVIDIA A100-SXM4-40GB)" in first
        sm_trend = app.query_one("#gpu-0").query(Trend)[1]
        assert not sm_trend.display  # no GPM: no empty SM trend
        assert not app.query_one("#gpu-note").display

    run(recorded_session(gpus=True), check)


def test_target_exit_in_attach_keeps_the_last_verdict_and_q_quits() -> None:
    base = recorded_session()
    session = RecordedWatch(store=base.store, analysis=base.analysis)

    async def check(app: WatchApp, pilot: Any) -> None:
        session.gone = True
        session.ended_at = NOW - 5.0
        session.sources["psutil"] = SourceStatus(Status.GONE, "the target process exited")
        app.refresh_view()
        await pilot.pause()
        verdict = text_of(app, "#verdict")
        assert verdict.startswith("dataloader-bound") and "The process exited" in verdict
        assert "psutil gone" in text_of(app, "#sources")
        await pilot.press("q")  # attach: nothing to stop, no question
        await pilot.pause()
        assert not app.is_running

    app = run(session, check)
    assert app.stop_training is False


def test_run_mode_exit_code_is_shown() -> None:
    child = FakeChild()

    async def check(app: WatchApp, pilot: Any) -> None:
        child.returncode = 3
        app.refresh_view()
        await pilot.pause()
        assert "The training exited with status 3" in text_of(app, "#verdict")
        assert app.check_action("burst", ()) is None
        await pilot.press("q")  # already exited: no question
        await pilot.pause()
        assert not app.is_running

    run(recorded_session(hooked=True), check, child=child)


def test_a_read_begun_before_the_shown_one_is_not_drawn_over_it() -> None:
    # CI beside a spinner: the reader thread's read, begun while the training ran, arrived after
    # refresh_view had drawn "exited with status 3" and put the live verdict back
    child = FakeChild()
    session = recorded_session(hooked=True)

    async def check(app: WatchApp, pilot: Any) -> None:
        assert app._reader is not None
        app._reader.stop()  # this test posts the reads itself
        begun = time.monotonic()
        stale = session.observe()  # the training still runs
        child.returncode = 3
        app.refresh_view()
        app.on_observation_read(ObservationRead(stale, begun))
        await pilot.pause()
        assert "The training exited with status 3" in text_of(app, "#verdict")
        child.returncode = None  # a later read is drawn (whatever it says)
        app.on_observation_read(ObservationRead(session.observe(), time.monotonic()))
        await pilot.pause()
        assert "exited" not in text_of(app, "#verdict")

    run(session, check, child=child)


def _quit_with(keys: tuple[str, ...]) -> WatchApp:
    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, QuitScreen)
        assert "The training (PID 5151) is still running" in text_of(app, "#quit-box Static")
        await pilot.press(*keys)
        await pilot.pause()

    return run(recorded_session(), check, child=FakeChild())


def test_q_in_run_mode_asks_and_y_stops_the_training() -> None:
    app = _quit_with(("y",))
    assert not app.is_running and app.stop_training is True


def test_q_in_run_mode_n_leaves_the_training_running() -> None:
    app = _quit_with(("n",))
    assert not app.is_running and app.stop_training is False


def test_q_in_run_mode_escape_stays() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("q")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert app.is_running and not isinstance(app.screen, QuitScreen)

    run(recorded_session(), check, child=FakeChild())


def test_pause_freezes_the_display_not_the_sampling() -> None:
    recorded = recorded_session()
    session = RecordedWatch(store=recorded.store)

    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("p")
        assert app.paused and "PAUSED" in str(app.query_one("#top").border_subtitle)
        session.analysis = recorded.analysis
        app.refresh_view()  # a snapshot arrives while paused
        await pilot.pause()
        assert text_of(app, "#verdict").startswith("starting")
        await pilot.press("p")
        await pilot.pause()
        assert text_of(app, "#verdict").startswith("dataloader-bound")

    run(session, check)


def test_the_status_line_shows_the_cadence_and_a_key_makes_it_fast() -> None:
    session = recorded_session()
    session.sampling = SamplingView(mode="steady", reason="the verdict held for 10 evaluations in a row")

    async def check(app: WatchApp, pilot: Any) -> None:
        assert text_of(app, "#sources").startswith("sampling: steady · psutil ok")
        await pilot.press("4")
        app.refresh_view()
        await pilot.pause()
        assert session.wakes == ["a key was pressed in the TUI"]
        assert text_of(app, "#sources").startswith("sampling: fast · psutil ok")

    run(session, check)


def test_e_writes_the_json_report(tmp_path: Path) -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("e")
        await app.workers.wait_for_complete()
        await pilot.pause()

    run(recorded_session(), check, report_dir=tmp_path)
    (path,) = tmp_path.glob(f"torchwatch-report-{MAIN}-*.json")
    data = json.loads(path.read_text())
    assert data["schema"] == "torchwatch.report/1" and data["verdict"]["label"] == "dataloader-bound"
    assert data["target"] == {"pid": MAIN, "cmdline": ["python", "train.py"], "exit_code": None}
    assert data["sources"]["nvml"]["status"] == "unavailable"
    assert [h["label"] for h in data["verdict_history"]] == ["undetermined", "dataloader-bound"]


def test_e_report_carries_the_hook_summary(tmp_path: Path) -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("e")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert any("report written to" in n.message for n in app._notifications)

    run(recorded_session(hooked=True), check, report_dir=tmp_path, child=FakeChild())
    (path,) = tmp_path.glob("torchwatch-report-5151-*.json")
    data = json.loads(path.read_text())
    assert data["target"]["cmdline"] == ["python", "train.py"]
    assert data["hook"]["steps"] == 1234  # the report carries what the hook measured


def test_question_mark_lists_every_binding() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        keys = {k for k, _ in app.screen.rows}
        assert {"q", "?", "b", "p", "e", "tab / shift+tab", "enter (findings)", "s (processes)"} <= keys
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)

    run(recorded_session(), check)


def test_an_observation_or_log_lines_arriving_while_the_app_shuts_down_are_dropped() -> None:
    """The reader thread is joined in on_unmount, after Textual has removed the panels: what it
    posted meanwhile must not raise NoMatches (a CI run failed that way once)."""
    session = recorded_session()

    async def check(app: WatchApp, pilot: Any) -> None:
        assert app.observation is not None

    app = run(session, check)
    assert not app.is_running and not app.default_screen.query(FindingsList)
    late = session.observe()
    app.on_observation_read(ObservationRead(late))
    app.on_log_read(LogRead(["demo: step 3"]))
    assert app.observation is not late


def test_log_pane_tails_the_training_output(tmp_path: Path) -> None:
    log = tmp_path / "training.log"
    log.write_text("demo: step 1\n")

    async def check(app: WatchApp, pilot: Any) -> None:
        with open(log, "a") as f:
            f.write("demo: step 2\nTraceback (most recent call last):\n")
        view = app.query_one(Log)
        for _ in range(100):
            await pilot.pause(0.02)
            if view.line_count >= 3:
                break
        assert list(view.lines)[:3] == ["demo: step 1", "demo: step 2", "Traceback (most recent call last):"]
        assert str(log) in text_of(app, "#log-title")

    run(recorded_session(), check, log_path=log, refresh_s=0.02)


def test_resize_keeps_the_verdict_and_the_panels() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        assert app.has_class("-short") and not app.has_class("-tall")
        await pilot.resize_terminal(160, 48)
        await pilot.pause()
        assert app.has_class("-tall") and not app.has_class("-short")
        assert app.query_one("#findings").size.height > 6
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.query_one("#verdict").region.height >= 3
        assert app.query_one("#panels").region.height >= 7
        assert app.query_one("#panels").region.bottom <= 24

    run(recorded_session(), check, size=(80, 24))


def test_duration_ends_the_app() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        for _ in range(100):
            if not app.is_running:
                break
            await pilot.pause(0.02)
        assert not app.is_running

    run(recorded_session(), check, duration=0.1)


def _with_device_memory(session: RecordedWatch, cuda: bool, memory: dict[str, int] | None) -> None:
    """The hook publishes again, as a training that initialised CUDA (and read its allocator) would:
    its hook.json goes through the reader's decoder like any other."""
    last = session.store.latest(HookState)
    assert last is not None and last.record is not None
    data = {**last.record.to_json(), "cuda_initialized": cuda}
    if memory is not None:
        data["device_memory"] = memory
    session.store.add([dataclasses.replace(last, record=wire.HookRecord.decode(data))])


def test_memory_panel_shows_the_allocator_the_hook_publishes_and_why_not() -> None:
    session = recorded_session(gpus=True, hooked=True)
    gib = 1 << 30

    def device_text(app: WatchApp) -> str:
        return text_of(app, "#memory-device")

    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("6")
        assert app.query_one(TabbedContent).active == "memory"
        assert "device used 11.7 GiB / 37.3 GiB (NVML)" in device_text(app)
        assert "allocator n/a (the training has not initialised CUDA)" in device_text(app)
        assert not app.query_one("#memory-alloc").display  # no allocator reading: no empty trend
        _with_device_memory(session, cuda=True, memory=None)
        app.refresh_view()
        await pilot.pause()
        assert "allocator n/a (the hook has not published device memory)" in device_text(app)
        memory = {"device": 0, "allocated_bytes": 9 * gib, "reserved_bytes": 10 * gib, "peak_bytes": 19 * gib // 2}
        _with_device_memory(session, cuda=True, memory=memory)
        app.refresh_view()
        await pilot.pause()
        assert "allocator 9.0 GiB allocated / 10.0 GiB reserved (peak 9.5 GiB)" in device_text(app)
        # FABRICATED recorded-shape reading (no GPU lent): the hook also gives the device's capacity
        for i, allocated in enumerate((9, 30, 70)):
            memory = {
                **memory,
                **{"allocated_bytes": allocated * gib, "reserved_bytes": 74 * gib, "peak_bytes": 72 * gib},
                **{"capacity_bytes": 80 * gib, "alloc_retries": 2, "t": 100.0 + i},
            }
            _with_device_memory(session, cuda=True, memory=memory)
            assert session.analysis is not None  # one trend point per analysis tick
            session.analysis = dataclasses.replace(session.analysis, t=session.analysis.t + 1.0)
            app.refresh_view()
            await pilot.pause()
        text = device_text(app)
        assert "allocator 70.0 GiB allocated / 74.0 GiB reserved (peak 72.0 GiB) of 80.0 GiB on cuda:0" in text
        assert "(92% at most)" in text and "2 allocation retries" in text
        trend = app.query_one("#memory-alloc")
        assert trend.display and trend.data[-2:] == (30 * gib, 70 * gib)  # type: ignore[attr-defined]

    run(session, check, size=(120, 30))
    data: dict[str, Any] = report.build(session.observe()).to_json()
    mem = data["hook"]["device_memory"]
    assert {k: mem[k] for k in ("allocated_bytes", "reserved_bytes", "peak_bytes", "why")} == {
        "allocated_bytes": 70 * gib,
        "reserved_bytes": 74 * gib,
        "peak_bytes": 72 * gib,
        "why": None,
    }
    assert (mem["capacity_bytes"], mem["alloc_retries"], mem["device"]) == (80 * gib, 2, 0)
    assert mem["allocated_series"][-2:] == [30 * gib, 70 * gib]


def test_memory_panel_without_a_hook_says_so() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("6")
        text = text_of(app, "#memory-device")
        assert "device used n/a (no NVML reading)" in text
        assert "allocator n/a (no hook in the process: device memory comes from the in-process hook)" in text

    run(recorded_session(), check, size=(140, 30))


def _colours(app: WatchApp) -> set[str]:
    """Every colour left in the lines the verdict widget renders once the app's line filters ran."""
    from textual.color import Color

    widget = app.screen.query_one("#verdict", Static)
    found: set[str] = set()
    for y in range(widget.size.height):
        strip = widget.render_line(y)
        for line_filter in app.get_line_filters():
            strip = strip.apply_filter(line_filter, Color(0, 0, 0))
        for segment in strip:
            style = segment.style
            if style is None:
                continue
            found |= {c.name for c in (style.color, style.bgcolor) if c is not None and not c.is_default}
    return found


def test_no_color_draws_no_colour_not_greys(monkeypatch: Any) -> None:
    """no-color.org: with NO_COLOR set no colour is added. Textual's own answer (Monochrome) still
    draws 24-bit greys; the app draws in the terminal's default colours."""
    seen: dict[str, set[str]] = {}

    async def check(app: WatchApp, pilot: Any) -> None:
        seen["colours"] = _colours(app)

    run(recorded_session(), check)
    assert seen["colours"], "the verdict is drawn in colour without NO_COLOR"
    monkeypatch.setenv("NO_COLOR", "1")
    run(recorded_session(), check)
    assert seen["colours"] == set()


def _with_progress(session: RecordedWatch) -> RecordedWatch:
    """The recorded training's last minute with the hook's progress: epoch 2, 30 of 50 batches at
    half a batch a second (20 to come: 40 s), a loss falling from 2.0, read 4 times a second."""
    record = recorded_record()
    samples: list[wire.LossSample] = []
    for k in range(60 * 4 + 1):
        t = NOW - 60.0 + k / 4
        samples.append(wire.LossSample(k + 1, t, 2.0 / (1 + k / 40)))
        if k % 4 == 0 and k:
            batch = 30 - (60 * 4 - k) // 4 // 2  # half a batch a second, up to 30 of epoch 2
            info = wire.ProgressInfo(2, max(1, batch), 50, tuple(samples[-wire.LOSS_HISTORY :]))
            session.store.add(
                [HookState(t, MAIN, 1000 + k, 1000 + k, 0.0, 0.0, record=dataclasses.replace(record, progress=info))]
            )
    return session


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_the_steps_panel_shows_the_epoch_the_loss_and_its_sparkline(size: tuple[int, int]) -> None:
    session = _with_progress(recorded_session(hooked=True))

    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("4")
        await pilot.pause()
        panel = app.query_one(StepsPanel)
        steps = plain(panel.query_one("#steps-text", Static).content)
        assert "epoch 2 · 30/50 · 40 s left" in steps, steps
        assert "loss 0.2857 at step 241, -0.789/min" in steps, steps  # 2 / (1 + 240 / 40)
        loss = panel.query_one("#steps-loss", Trend)
        assert loss.display and 12 <= len(loss.data) <= 13  # 5 s medians of the last minute (both ends)
        assert list(loss.data) == sorted(loss.data, reverse=True)  # falling
        panel.scroll_to_widget(loss, animate=False)
        await pilot.pause()
        assert loss.region.height > 0 and app.screen.region.contains_region(loss.region)

    run(session, check, size=size)


def test_without_a_loss_the_steps_panel_has_no_loss_row() -> None:
    async def check(app: WatchApp, pilot: Any) -> None:
        await pilot.press("4")
        await pilot.pause()
        assert not app.query_one(StepsPanel).query_one("#steps-loss", Trend).display

    run(recorded_session(hooked=True), check)
