"""The stall / hang recorder: its threshold and arming (pure functions of step times and the
clock), one fire per stall, the reading of real py-spy dumps (tests/fixtures/pyspy/dump_*.json),
the recorder's life cycle with a fake dump, and how a hang is said and written."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from textual.widgets import Static

from tests.unit.hangs import FIXTURES, _dump, _reading, _view
from tests.unit.ranks import JobWatch
from tests.unit.render import plain
from torchwatch.analysis import hang
from torchwatch.faces.hang import hang_file_text, hang_lines, hang_path, notice
from torchwatch.faces.report import write_atomic
from torchwatch.faces.tui.app import WatchApp
from torchwatch.model.hang import DumpedThread, HangView, ProcessDump
from torchwatch.model.observation import Observation, RankView, TargetView
from torchwatch.model.readings import Frame, Role
from torchwatch.sources.proc import TreeNode
from torchwatch.sources.pyspy import parse_dump
from torchwatch.watch.hang import HangRecorder
from torchwatch.wire import LossSample, ProgressInfo

SCHEMA = json.loads((Path(__file__).resolve().parent / "report_schema.json").read_text())


# -- threshold and arming -----------------------------------------------------------------------
def test_no_step_no_threshold_a_training_that_never_steps_is_not_armed() -> None:
    assert hang.threshold([]) is None
    clock = hang.StepClock()
    assert clock.overdue(10_000.0) is None  # hours without a first step: not this kind of hang


def test_threshold_is_30_s_for_fast_steps_and_20_p95_for_slow_ones() -> None:
    fast = [0.1] * 90 + [0.5] * 10  # p95 (inclusive) 0.5 s: 20 x 0.5 = 10 s < 30 s
    assert hang.threshold(fast) == (30.0, "max(30 s, 20 x p95 step 500 ms)")
    slow = [2.0] * 90 + [4.0] * 10  # p95 4 s -> 80 s
    limit, source = hang.threshold(slow)  # type: ignore[misc]
    assert limit == pytest.approx(80.0) and "4000 ms" in source
    assert hang.threshold(slow, hang_after=5.0) == (5.0, "--hang-after 5 s")


def test_the_clock_arms_at_the_first_step_and_fires_past_the_threshold_only() -> None:
    clock = hang.StepClock()
    clock.add([(100.0, 0.2)])
    assert clock.overdue(129.9) is None
    assert clock.overdue(130.5) == pytest.approx(30.5)
    clock.add([(99.0, 50.0)])  # an older step (read twice) changes nothing
    assert clock.last_end == 100.0 and list(clock.durations) == [0.2]


def test_one_fire_per_stall_then_a_stall_once_it_steps_again_and_a_new_stall_fires_again() -> None:
    det = hang.HangDetector(hang_after=5.0)
    det.add(1, [(10.0, 0.1), (10.1, 0.1)])
    det.add(2, [(10.05, 0.1)])
    assert det.check(14.0) is None
    fired = det.check(16.0)
    assert fired is not None and fired.pid == 2 and fired.last_end == 10.05  # the longest without a step
    assert det.check(17.0) is None and det.check(60.0) is None  # the same stall: once
    det.add(1, [(61.0, 0.1)])
    assert det.resumed_at is None  # rank 1 stepping does not end rank 2's stall
    det.add(2, [(61.0, 0.2)])
    assert det.resumed_at == 61.0
    assert det.check(62.0) is None
    again = det.check(66.5)  # a new stall
    assert again is not None and again.last_end == 61.0


def test_an_exited_process_is_forgotten() -> None:
    det = hang.HangDetector(hang_after=1.0)
    det.add(7, [(1.0, 0.1)])
    det.forget(7)
    assert det.check(100.0) is None


# -- the dumps ------------------------------------------------------------------------------------


def test_py_spy_json_is_read_outermost_frame_first() -> None:
    threads = parse_dump((FIXTURES / "dump_ddp_rank1_on_queue.json").read_text())
    (main,) = threads
    assert main.tid == 13958 and main.name == "MainThread" and not main.active
    assert main.frames[0].name == "<module>" and main.frames[-1].name == "Condition.wait"
    with pytest.raises(ValueError):
        parse_dump('{"not": "a list"}')


def test_the_rank_on_a_queue_is_the_odd_one_out_and_the_rank_in_backward_waits() -> None:
    rows = (
        hang.classify(_dump("dump_ddp_rank0_in_backward", 13957, "rank", 0)),
        hang.classify(_dump("dump_ddp_rank1_on_queue", 13958, "rank", 1)),
    )
    assert rows[0].state == "backward" and rows[0].where is not None and "torch/autograd/graph.py" in rows[0].where
    assert rows[1].state == "elsewhere"
    assert rows[1].top_frame is not None and rows[1].top_frame.startswith("wait_for_token (")
    odd = hang.odd_one_out(rows)
    assert odd is rows[1]
    line = hang.summary_line(rows, odd)
    assert line.startswith("rank 1 (PID 13958) is the odd one out, not in a collective, at wait_for_token (")
    assert "rank 0 (PID 13957) waits in backward (DDP's gradient all-reduce)" in line


def test_no_odd_one_out_when_every_rank_waits_or_several_are_elsewhere() -> None:
    waiting = hang.classify(_dump("dump_ddp_rank0_in_backward", 13957, "rank", 0))
    elsewhere = hang.classify(_dump("dump_ddp_rank1_on_queue", 13958, "rank", 1))
    assert hang.odd_one_out([waiting, waiting]) is None
    assert hang.odd_one_out([elsewhere, elsewhere, waiting]) is None
    assert hang.summary_line([waiting, waiting], None).startswith("no process stands out")


def test_the_stuck_worker_is_named_with_its_frame_the_idle_one_is_not() -> None:
    rows = (
        hang.classify(_dump("dump_training_waits_on_loader", 13760, "training")),
        hang.classify(_dump("dump_worker_in_getitem", 13778, "worker", parent=13760)),
        hang.classify(_dump("dump_worker_idle", 13779, "worker", parent=13760)),
    )
    assert [r.state for r in rows] == ["dataloader", "busy", "idle"]
    odd = hang.odd_one_out(rows)
    assert odd is rows[1]
    assert (
        odd.top_frame is not None
        and odd.top_frame.startswith("fetch_label (")
        and "stuck_worker.py:35" in odd.top_frame
    )
    assert hang.summary_line(rows, odd).startswith(
        "DataLoader worker PID 13778 is stuck in the dataset at fetch_label ("
    )


def test_a_failed_dump_is_unknown_with_its_reason() -> None:
    row = hang.classify(ProcessDump(5, "rank", 1, error="py-spy may not read process 5: permission denied"))
    assert row.state == "unknown" and row.error is not None and "permission denied" in row.error


# -- the recorder ---------------------------------------------------------------------------------
class FakeTree:
    """Two ranks under a launcher, one DataLoader worker under rank 1."""

    def __init__(self) -> None:
        self.nodes_ = {
            10: TreeNode(10, 1, Role.LAUNCHER, "torchrun", ("torchrun",), 0.0),
            11: TreeNode(11, 10, Role.MAIN, "python", ("python", "t.py"), 0.0),
            12: TreeNode(12, 10, Role.MAIN, "python", ("python", "t.py"), 0.0),
            13: TreeNode(13, 12, Role.WORKER, "python", ("python", "t.py"), 0.0),
        }

    def nodes(self) -> dict[int, TreeNode]:
        return dict(self.nodes_)

    def mains(self) -> list[int]:
        return [11, 12]

    def pids(self) -> list[int]:
        return list(self.nodes_)


def _frames(*names: str) -> tuple[Frame, ...]:
    return tuple(Frame(n, f, 1) for n, f in (name.split("@") for name in names))


FAKE_STACKS = {
    11: _frames("main@/job/t.py", "all_reduce@/site-packages/torch/distributed/distributed_c10d.py"),
    12: _frames("main@/job/t.py", "load@/job/t.py", "wait@/usr/lib/python3.11/threading.py"),
    13: _frames("_worker_loop@/site-packages/torch/utils/data/_utils/worker.py", "get@/usr/lib/python3.11/queue.py"),
}


def _fake_dump(pid: int) -> tuple[tuple[DumpedThread, ...], str | None, float]:
    return (DumpedThread(pid, "MainThread", False, FAKE_STACKS[pid]),), None, 0.01


def test_the_recorder_dumps_every_rank_and_worker_once_and_reports_the_stall_when_it_resumes() -> None:
    calls: list[int] = []

    def dump(pid: int) -> tuple[tuple[DumpedThread, ...], str | None, float]:
        calls.append(pid)
        return _fake_dump(pid)

    rec = HangRecorder(FakeTree(), started=0.0, hang_after=5.0, dump=dump)  # type: ignore[arg-type]
    progress = ProgressInfo(2, 17, 50, (LossSample(66, 0.9, 0.4125),))
    rec.feed([_reading(11, 0, ((1.0, 0.1, 0.0),), progress), _reading(12, 1, ((1.0, 0.1, 0.0),), progress)])
    assert not rec.check(5.5) and rec.view(5.5) is None
    assert rec.check(6.5)
    rec.join(5.0)
    view = rec.view(8.0)
    assert view is not None and view.state == "hang" and sorted(calls) == [11, 12, 13]
    assert view.detected_after_s == 5.5 and view.stalled_s == 7.0 and view.number == 1
    assert view.odd_one_out is not None and view.odd_one_out.rank == 1
    assert view.odd_one_out.top_frame == "load (/job/t.py:1)"
    assert [p.state for p in view.processes] == ["collective", "elsewhere", "idle"]
    assert view.progress == "epoch 2, batch 17/50, loss 0.4125 at step 66"  # as its hook last published
    assert "  its training then: epoch 2, batch 17/50, loss 0.4125 at step 66" in hang_lines(view)
    assert not rec.check(30.0) and sorted(calls) == [11, 12, 13]  # once per stall
    rec.feed([_reading(12, 1, ((40.0, 0.1, 0.0),))])  # the rank that fired (the first by age) steps
    rec.feed([_reading(11, 0, ((40.0, 0.1, 0.0),))])
    after = rec.view(41.0)
    assert after is not None and after.state == "stall" and after.resumed_s == 40.0 and after.stalled_s == 39.0
    assert "stepped again at 40 s" in (notice(after) or "")
    jsonschema.validate(
        json.loads(json.dumps(after.to_json())), SCHEMA["properties"]["hang"] | {"$defs": SCHEMA["$defs"]}
    )


# -- how it is said and written ------------------------------------------------------------------


def test_the_report_lines_and_the_hang_file_name_the_odd_rank_and_hold_every_thread() -> None:
    view = _view()
    lines = hang_lines(view)
    assert lines[0].startswith("HANG: rank 0 (PID 13957) has made no step for 9 s (since 12 s; threshold 5 s")
    assert any(line.split()[:2] == ["rank", "1"] and "wait_for_token" in line for line in lines[2:])
    text = hang_file_text(view, "r.json")
    assert 'Thread 13958 (idle): "MainThread"' in text
    frames = [ln.strip() for ln in text.splitlines() if ln.startswith("      ")]
    assert frames[0].startswith("Condition.wait (") and frames[-1].startswith("<module> (")  # innermost first
    assert hang_path(Path("/x/run.json")) == Path("/x/run.hang.txt")
    assert notice(None) is None and "dumping every thread" in (
        notice(HangView(**{**view.__dict__, "state": "dumping"})) or ""
    )


def test_the_hang_file_replaces_a_planted_symlink_never_writes_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    path = hang_path(tmp_path / "r.json")
    os.symlink(victim, path)
    write_atomic(path, hang_file_text(_view(), "r.json"))
    assert victim.read_text() == "keep" and not path.is_symlink() and "wait_for_token" in path.read_text()


def test_the_tui_shows_the_hang_above_the_sources_and_notifies_once_per_change() -> None:
    obs = Observation(t=0.0, elapsed_s=20.0, window_s=10.0, target=TargetView(5), ranks={0: RankView(0, 5)})
    watch = JobWatch(obs)
    app = WatchApp(watch)
    notes: list[str] = []
    app.notify = lambda message, **kw: notes.append(str(message))  # type: ignore[method-assign]

    async def go() -> None:
        async with app.run_test(size=(140, 34)) as pilot:
            await pilot.pause()
            assert "HANG" not in plain(app.query_one("#sources", Static).content) and notes == []
            app.observation = watch.obs = replace(obs, t=1.0, hang=_view())
            await pilot.pause()
            shown = plain(app.query_one("#sources", Static).content)
            assert "HANG: rank 0 (PID 13957)" in shown and "rank 1 (PID 13958) is the odd one out" in shown
            app.observation = watch.obs = replace(obs, t=2.0, hang=_view())  # the same hang: no new notification
            await pilot.pause()
            assert len(notes) == 1 and notes[0].startswith("HANG: rank 0")

    asyncio.run(go())
