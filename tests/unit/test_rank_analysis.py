"""Per-rank readings, the straggler and the job's verdict (torchwatch.analysis.ranks), and how the
report and the status line show them."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import jsonschema
import pytest
from textual.widgets import TabbedContent

from tests.unit.hookrecords import hook_record
from tests.unit.ranks import JobWatch, rank_state
from tests.unit.reports import SCHEMA
from torchwatch.analysis import ranks
from torchwatch.analysis.diagnosis import Analysis
from torchwatch.analysis.features import CATALOGUE, compute
from torchwatch.analysis.store import Store, Window
from torchwatch.faces import report
from torchwatch.faces.headless import status_line
from torchwatch.faces.tui.app import WatchApp
from torchwatch.faces.tui.widgets import RanksTable
from torchwatch.model.findings import Finding, Verdict
from torchwatch.model.observation import Observation, RankReading, RankView, TargetView
from torchwatch.model.readings import HookState
from torchwatch.watch.observe import Tick, Trends, observe


def analysis(label: str, rule: str | None = None) -> Analysis:
    findings = [Finding(rule, label, "warning", f"{rule} fired", 0.5, {}, (), "test")] if rule else []
    return Analysis(
        t=3.0, features={name: None for name in CATALOGUE}, findings=findings, verdict=Verdict(label, 0.7, f"{label}!")
    )


def job(states: list[HookState], labels: dict[int, Analysis]) -> tuple[tuple[Any, ...], Any]:
    window = Window(0.0, 10.0, hook=states)
    readings = ranks.rank_readings(window, labels)
    return readings, ranks.straggler(readings)


def test_rank_with_slow_data_is_the_straggler() -> None:
    # Rank 1 loads for 64 ms, rank 0 for 16: rank 0 waits ~48 ms of an 80 ms step in backward.
    states = [rank_state(100, 0, 16, 4, 87), rank_state(101, 1, 64, 4, 87)]
    per = {100: analysis("undetermined", "ranks-collective-wait"), 101: analysis("dataloader-bound", "loader-x")}
    readings, found = job(states, per)
    assert [r.rank for r in readings] == [0, 1]
    assert readings[0].collective_wait_ms == pytest.approx(64, abs=0.01)
    assert readings[1].arrive_ms == pytest.approx(68, abs=0.01)
    assert found is not None and found.rank == 1 and found.victim_rank == 0
    assert found.score == pytest.approx(48 / 87, abs=1e-3)
    assert found.severity == "critical" and found.part == "data" and found.top_finding == "loader-x"
    verdict = ranks.job_analysis(per[100], per, found).verdict
    assert verdict.label == "dataloader-bound"
    assert verdict.summary.startswith("Rank 1 is the straggler")


def test_balanced_ranks_name_no_straggler() -> None:
    states = [rank_state(100, 0, 16, 4, 45), rank_state(101, 1, 17, 4, 45)]
    per = {100: analysis("undetermined"), 101: analysis("undetermined")}
    readings, found = job(states, per)
    assert len(readings) == 2 and found is None  # 1 ms apart: a score of 0.02
    assert ranks.job_analysis(per[100], per, found).verdict.summary == "undetermined!"


def test_score_below_warning_names_none_and_at_critical_is_critical() -> None:
    # 6.5 ms of a 50 ms step: 0.13 (warning); 11 ms: 0.22 (critical).
    warn = job([rank_state(1, 0, 10, 4, 50), rank_state(2, 1, 16.5, 4, 50)], {1: analysis("x"), 2: analysis("y")})[1]
    crit = job([rank_state(1, 0, 10, 4, 50), rank_state(2, 1, 21, 4, 50)], {1: analysis("x"), 2: analysis("y")})[1]
    low = job([rank_state(1, 0, 10, 4, 50), rank_state(2, 1, 14, 4, 50)], {1: analysis("x"), 2: analysis("y")})[1]
    assert warn is not None and warn.severity == "warning"
    assert crit is not None and crit.severity == "critical"
    assert low is None


def test_gpu_rank_backward_block_is_not_collective_wait() -> None:
    # On a GPU the caller blocks for all of backward: that is no wait on peers.
    readings, found = job(
        [rank_state(1, 0, 10, 4, 80, cuda=True), rank_state(2, 1, 60, 4, 80, cuda=True)],
        {1: analysis("x"), 2: analysis("y")},
    )
    assert all(r.collective_wait_ms == 0 for r in readings) and found is None


def test_collective_wait_share_less_run_queue() -> None:
    state = rank_state(100, 0, 16, 4, 87)
    f = compute(Window(0.0, 10.0, hook=[state]), 100)
    assert f["collective_wait_share"] == pytest.approx(64 / 87, abs=1e-3)
    single = hook_record(100)  # not a rank: backward's blocked part is its own, not a wait on peers
    lone = HookState(**{**state.__dict__, "record": single})
    assert compute(Window(0.0, 10.0, hook=[lone]), 100)["collective_wait_share"] == 0.0


def straggler_job() -> Observation:
    """The Observation of a 2-rank job whose rank 1 loads slowly (the straggler, shown)."""
    states = [rank_state(100, 0, 16, 4, 87), rank_state(101, 1, 64, 4, 87)]
    per = {100: analysis("undetermined", "ranks-collective-wait"), 101: analysis("dataloader-bound", "loader-x")}
    readings, found = job(states, per)
    focus = per[100]
    focus.per_rank, focus.ranks = per, readings
    final = ranks.job_analysis(focus, per, found)
    store = Store()
    store.add(states)
    tick = Tick(
        now=3.0, end=3.0, started=0.0, window_s=10.0, analysis=final, statuses=(), focus_pid=101,
        target=TargetView(99),
    )  # fmt: skip
    return observe(store, tick, Trends())


def test_report_and_status_line_name_the_straggler() -> None:
    obs = straggler_job()
    assert sorted(obs.ranks) == [0, 1] and obs.focus_rank == 1
    assert obs.ranks[0].verdict is not None and obs.ranks[0].verdict.label == "undetermined"
    made = report.build(obs)
    data: dict[str, Any] = made.to_json()
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    assert data["straggler"]["rank"] == 1 and data["straggler"]["label"] == "dataloader-bound"
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and data["ranks"][1]["focus"] is True
    assert "straggler: rank 1 (PID 101)" in report.render_text(made)
    assert "2 ranks, straggler rank 1" in status_line(obs, 3.0)


def test_tui_ranks_table_highlights_the_straggler_and_chooses_a_rank() -> None:
    watch = JobWatch(straggler_job())
    app = WatchApp(watch)

    async def go() -> None:
        async with app.run_test(size=(140, 34)) as pilot:
            await pilot.pause()
            await pilot.press("8")
            await pilot.pause()
            tabs = app.query_one(TabbedContent)
            assert tabs.active == "ranks"
            table = app.query_one(RanksTable)
            rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
            assert rows[0][0].strip() == "0" and rows[1][0] == "● 1"  # rank 1 shown
            assert rows[1][-1].startswith("dataloader-bound  ◀ straggler (0.55)")
            assert rows[0][5] == "64.0"  # rank 0 waits in the all-reduce
            assert table.get_row_at(1)[0].style == "bold red"
            table.focus()
            table.move_cursor(row=0)
            await pilot.press("enter")
            await pilot.press("a")
            await pilot.pause()
            assert watch.chosen == [0, None]

    asyncio.run(go())


def test_tui_hides_the_ranks_panel_for_one_process() -> None:
    obs = Observation(t=0.0, elapsed_s=1.0, window_s=10.0, target=TargetView(5), ranks={0: RankView(0, 5)})
    app = WatchApp(JobWatch(obs))

    async def go() -> None:
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            before = app.query_one(TabbedContent).active
            await pilot.press("8")
            await pilot.pause()
            assert app.query_one(TabbedContent).active == before != "ranks"

    asyncio.run(go())


def test_one_process_report_has_no_ranks() -> None:
    obs = Observation(
        t=0.0, elapsed_s=1.0, window_s=10.0, target=TargetView(5), ranks={0: RankView(0, 5)},
        verdict=Verdict("cpu-bound", 0.8, "busy"),
    )  # fmt: skip
    data: dict[str, Any] = report.build(obs).to_json()
    assert data["ranks"] == [] and data["straggler"] is None
    line = status_line(obs, 1.0)
    assert line.startswith("torchwatch [   1s] cpu-bound") and "ranks" not in line


def comm_job(wait_ms: float) -> Analysis:
    """Two ranks waiting ``wait_ms`` of a 100 ms step in collectives (40 % once their run-queue wait
    is taken out), no straggler; the rank shown also finds its loop on the CPU."""
    per = {}
    for pid in (1, 2):
        a = analysis("cpu-bound", "loop-cpu")
        comm = Finding(ranks.COMM_RULE, "undetermined", "warning", "comm", 0.4, {}, (), "test")
        a.findings.append(comm)
        a.features = {**a.features, "collective_wait_share": 0.4}
        per[pid] = a
    reading = RankReading(0, 1, 2, 20, 100.0, 0.0, 20.0, wait_ms)
    per[1].ranks = (reading, replace(reading, rank=1, pid=2))
    return ranks.job_analysis(per[1], per, None)


def test_ranks_waiting_on_each_other_make_a_communication_verdict() -> None:
    waiting = comm_job(wait_ms=57.0)  # most of the step in the all-reduce
    assert waiting.verdict.label == "undetermined"
    assert waiting.verdict.summary.startswith("Communication-bound: the ranks wait 40%")
    assert waiting.findings[0].rule == ranks.COMM_RULE
    busy = comm_job(wait_ms=45.0)  # the loop works more than it waits: its label stays, the finding first
    assert busy.verdict.label == "cpu-bound" and "the ranks wait 40%" in busy.verdict.summary
    assert busy.findings[0].rule == ranks.COMM_RULE
