"""The cadence policy: fast until the verdict settles, steady after, fast again at once on each trigger."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from tests.unit.hookrecords import hook_record
from torchwatch.analysis.diagnosis import Analysis
from torchwatch.model.findings import Finding, Verdict
from torchwatch.model.observation import Straggler
from torchwatch.model.readings import HookState, Role, Status
from torchwatch.watch.cadence import (
    CHANGES_KEPT,
    FAST,
    REFERENCE_READINGS,
    SETTLE_EVALUATIONS,
    SHIFT_HOLD,
    STEADY,
    Cadence,
    CadencePolicy,
    CadenceReading,
    Pacer,
    cadence_reading,
    fast_cadence,
    steady_cadence,
    until_tick,
)
from torchwatch.watch.options import SessionOptions

BASE = CadenceReading(
    label="dataloader-bound",
    top_finding="loader-cpu-in-main-thread",
    confidence=0.9,
    step_time_s=0.25,
    steps=40.0,
    data_wait=0.6,
    processes=(1, 0),
    burst="idle:0",
)


def settled(reading: CadenceReading = BASE, settle: int = SETTLE_EVALUATIONS) -> CadencePolicy:
    """A policy that has seen ``settle`` identical readings (steady)."""
    policy = CadencePolicy(settle=settle)
    for _ in range(settle):
        policy.update(reading)
    assert policy.mode == STEADY
    return policy


def test_fast_until_settle_evaluations_agree_then_steady() -> None:
    policy = CadencePolicy()
    modes = [policy.update(BASE).mode for _ in range(SETTLE_EVALUATIONS + 3)]
    assert modes[: SETTLE_EVALUATIONS - 1] == [FAST] * (SETTLE_EVALUATIONS - 1)
    assert modes[SETTLE_EVALUATIONS - 1 :] == [STEADY] * 4
    assert "held" in policy.reason


def test_collecting_evidence_never_settles() -> None:
    policy = CadencePolicy()
    collecting = CadenceReading(label="undetermined", collecting=True)
    for _ in range(3 * SETTLE_EVALUATIONS):
        assert policy.update(collecting).mode == FAST


def test_a_changing_label_restarts_the_count() -> None:
    policy = CadencePolicy()
    for _ in range(SETTLE_EVALUATIONS - 1):
        policy.update(BASE)
    other = replace(BASE, label="cpu-bound", top_finding="loop-cpu")
    # the evaluation that changed the label is the first of the new verdict's run
    assert policy.update(other).mode == FAST
    for _ in range(SETTLE_EVALUATIONS - 2):
        assert policy.update(other).mode == FAST
    assert policy.update(other).mode == STEADY
    assert policy.changes == 0  # it never settled before


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"label": "io-bound"}, "verdict changed"),
        ({"top_finding": "loader-cpu-contention"}, "verdict changed"),
        ({"straggler": 4242}, "straggler changed"),
        ({"processes": (1, 2)}, "appeared or exited"),
        ({"processes": (2, 0)}, "appeared or exited"),
        ({"burst": "armed:0"}, "burst"),
        ({"burst": "idle:1"}, "burst"),
    ],
)
def test_each_discrete_trigger_returns_to_fast_at_once(change: dict[str, object], why: str) -> None:
    policy = settled()
    cadence = policy.update(replace(BASE, **change))  # type: ignore[arg-type]
    assert cadence.mode == FAST
    assert why in policy.reason
    assert policy.changes == 1


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"step_time_s": 0.25 * 1.3}, "step time moved +30%"),
        ({"step_time_s": 0.25 * 0.7}, "step time moved -30%"),
        ({"data_wait": 0.45}, "data wait moved -15 points"),
        ({"confidence": 0.75}, "evidence weakened"),
    ],
)
def test_each_continuous_trigger_returns_to_fast_when_it_holds(change: dict[str, object], why: str) -> None:
    """A step time, data wait or confidence past its line once is noise; SHIFT_HOLD evaluations in
    a row is a change."""
    policy = settled()
    moved = replace(BASE, **change)  # type: ignore[arg-type]
    for _ in range(SHIFT_HOLD - 1):
        assert policy.update(moved).mode == STEADY
    assert policy.update(moved).mode == FAST
    assert why in policy.reason
    assert policy.changes == 1


def test_a_continuous_move_that_does_not_hold_keeps_steady() -> None:
    """Past the line, back within it, past again: the count starts again each time."""
    policy = settled()
    moved = replace(BASE, step_time_s=0.25 * 1.3)
    for _ in range(3):
        for _ in range(SHIFT_HOLD - 1):
            assert policy.update(moved).mode == STEADY
        assert policy.update(BASE).mode == STEADY
    assert policy.changes == 0
    # different continuous readings past their lines in a row add up: the loop did change
    for _ in range(SHIFT_HOLD - 1):
        policy.update(moved)
    assert policy.update(replace(BASE, data_wait=0.45)).mode == FAST


@pytest.mark.parametrize(
    "change",
    [
        {"step_time_s": 0.25 * 1.2},  # within STEP_SHIFT
        {"data_wait": 0.65},  # within WAIT_SHIFT
        {"confidence": 0.85},  # within CONFIDENCE_DROP
        {"step_time_s": None, "data_wait": None},  # a reading missing: no evidence of a change
    ],
)
def test_small_moves_keep_steady(change: dict[str, object]) -> None:
    policy = settled()
    assert policy.update(replace(BASE, **change)).mode == STEADY  # type: ignore[arg-type]
    assert policy.changes == 0


def test_wake_returns_to_fast_and_the_count_starts_again() -> None:
    policy = settled()
    assert policy.wake("a key was pressed in the TUI").mode == FAST
    assert policy.reason == "a key was pressed in the TUI"
    for _ in range(SETTLE_EVALUATIONS - 1):
        assert policy.update(BASE).mode == FAST
    assert policy.update(BASE).mode == STEADY
    assert policy.changes == 1


def test_the_reference_is_the_end_of_the_settling_run() -> None:
    """A step time and a data wait that still ramped while settling: the reference is the median
    of the last REFERENCE_READINGS readings, not the first ones."""
    policy = CadencePolicy()
    for i in range(SETTLE_EVALUATIONS):  # 0.20 .. 0.29 s and 0.50 .. 0.95: last five 0.25 .. 0.29
        policy.update(replace(BASE, step_time_s=0.20 + 0.01 * i, data_wait=0.5 + 0.05 * i))
    assert policy.mode == STEADY
    ref = 0.20 + 0.01 * (SETTLE_EVALUATIONS - 1 - REFERENCE_READINGS // 2)
    wait = 0.5 + 0.05 * (SETTLE_EVALUATIONS - 1 - REFERENCE_READINGS // 2)
    assert policy.update(replace(BASE, step_time_s=ref * 1.2, data_wait=wait)).mode == STEADY
    for _ in range(SHIFT_HOLD - 1):
        assert policy.update(replace(BASE, step_time_s=ref * 1.3, data_wait=wait)).mode == STEADY
    assert policy.update(replace(BASE, step_time_s=ref * 1.3, data_wait=wait)).mode == FAST


def test_few_steps_in_the_window_are_not_compared() -> None:
    """A 4 s step gives 2-3 steps a window: their median jumps with each step, so only the data
    wait and the verdict are watched."""
    slow = replace(BASE, step_time_s=4.0, steps=2.5)
    policy = settled(slow)
    for _ in range(2 * SHIFT_HOLD):
        assert policy.update(replace(slow, step_time_s=7.0)).mode == STEADY
    for _ in range(SHIFT_HOLD - 1):
        policy.update(replace(slow, step_time_s=7.0, data_wait=0.75))
    assert policy.update(replace(slow, step_time_s=7.0, data_wait=0.75)).mode == FAST


def test_the_fast_cadence_is_the_options_rates() -> None:
    """Each paced source's fast pace, as the session's options and the sources give it."""
    fast = fast_cadence()
    assert fast.mode == FAST and fast.analysis_interval_s == 1.0
    assert dict(fast.paces) == {
        "psutil": {"interval_s": 1.0},
        "threads": {"interval_s": 0.1, "all_interval_s": 1.0},
        "py-spy": {"rate": 20, "chunk_s": 3.0},
        "hook": {"interval_s": 0.5},
        "nvml": {"interval_s": 1.0},
    }
    opts = SessionOptions(pyspy_rate=7, pyspy_chunk_s=4.0, thread_interval_s=0.3, analysis_interval_s=0.5)
    mine = fast_cadence(opts)
    assert mine.pace("py-spy") == {"rate": 7, "chunk_s": 4.0} and mine.pace("threads")["interval_s"] == 0.3
    assert mine.analysis_interval_s == 0.5


def test_steady_cadence_is_slower_than_fast_everywhere() -> None:
    fast = fast_cadence()
    steady = steady_cadence(fast)
    assert steady.mode == STEADY
    assert dict(steady.paces) == {
        "psutil": {"interval_s": 2.0},
        "threads": {"interval_s": 0.2, "all_interval_s": 2.0},
        "py-spy": {"rate": 5, "chunk_s": 8.0},
        "hook": {"interval_s": 1.0},
        "nvml": {"interval_s": 2.0},
    }
    assert steady.pace("py-spy")["rate"] < fast.pace("py-spy")["rate"]
    assert steady.pace("py-spy")["chunk_s"] > fast.pace("py-spy")["chunk_s"]
    for source, pace in fast.paces.items():
        for knob, value in pace.items():
            if knob.endswith("_s") and source != "py-spy":
                assert steady.pace(source)[knob] > value, (source, knob)
    assert steady.analysis_interval_s > fast.analysis_interval_s
    # a short --window gets chunks that fit in it (every window holds a chunk's stacks)
    assert steady_cadence(fast, window_s=5.0).pace("py-spy")["chunk_s"] == 4.0
    assert steady_cadence(fast, window_s=3.0).pace("py-spy")["chunk_s"] == fast.pace("py-spy")["chunk_s"]
    # a user's slower --rate is never made faster by the steady cadence
    slow = steady_cadence(fast_cadence(SessionOptions(pyspy_rate=2, pyspy_chunk_s=10.0, thread_interval_s=1.0)))
    assert (slow.pace("py-spy")["rate"], slow.pace("py-spy")["chunk_s"], slow.pace("threads")["interval_s"]) == (
        2,
        10.0,
        1.0,
    )


# -- the samplers' grid ----------------------------------------------------------------------------
@pytest.mark.parametrize("interval", [0.1, 0.2, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("now", [0.0, 0.013, 12345.678, 98765.4321])
def test_a_sampler_wakes_on_the_next_multiple_of_its_interval(now: float, interval: float) -> None:
    wait = until_tick(now, interval)
    assert interval / 2 - 1e-9 <= wait < 1.5 * interval + 1e-9
    ticks = (now + wait) / interval
    assert ticks == pytest.approx(round(ticks), abs=1e-6)


def test_a_wake_a_little_early_or_late_counts_as_its_tick() -> None:
    # Woken 1 ms before the tick at 10.0 s or 1 ms after it: either way the next one is 10.2 s.
    assert until_tick(10.0 - 1e-3, 0.2) == pytest.approx(0.201)
    assert until_tick(10.0 + 1e-3, 0.2) == pytest.approx(0.199)
    assert until_tick(10.0, 0.0) == 0.0  # back to back (py-spy's chunks block on their own)


@pytest.mark.parametrize("steady", [False, True])
def test_every_sampler_of_a_cadence_wakes_on_a_tick_of_the_fastest(steady: bool) -> None:
    """The point of the grid: a slower sampler never wakes the process at an instant of its own."""
    fast = fast_cadence()
    c = steady_cadence(fast) if steady else fast
    intervals = [v for pace in c.paces.values() for knob, v in pace.items() if knob.endswith("interval_s")]
    intervals.append(c.analysis_interval_s)
    finest = min(intervals)
    start = 4321.987
    for interval in intervals:
        now = start
        for _ in range(10):
            now += until_tick(now, interval)
            on_finest = now / finest
            assert on_finest == pytest.approx(round(on_finest), abs=1e-6), (interval, now)


# -- what one analysis tick tells the policy --------------------------------------------------------
STEPPING = Analysis(
    t=3.0,
    features={"step_time_p50_ms": 250.0, "hook_steps_per_s": 4.0, "data_wait_fraction": 0.3},
    findings=[
        Finding("loop-sleeps", "undetermined", "info", "sleeps", 0.1, {}, (), ""),
        Finding("loop-cpu", "cpu-bound", "critical", "The loop computes.", 0.8, {}, (), ""),
    ],
    verdict=Verdict("cpu-bound", 0.9, "The loop computes."),
)
IDLE = Verdict("undetermined", 0.3, "No resource is seen limiting the loop.")


def reading_of(
    analysis: Analysis,
    hook: Status = Status.OK,
    focus_hook: HookState | None = None,
    roles: tuple[Role, ...] = (Role.LAUNCHER, Role.MAIN, Role.WORKER, Role.WORKER),
    now: float = 100.0,
) -> CadenceReading:
    return cadence_reading(analysis, window_s=10.0, roles=roles, focus_hook=focus_hook, hook_status=hook, now=now)


def test_the_reading_takes_the_verdict_its_finding_the_loop_and_the_tree() -> None:
    r = reading_of(STEPPING)
    assert (r.label, r.top_finding, r.confidence) == ("cpu-bound", "loop-cpu", 0.9)
    assert r.step_time_s == 0.25 and r.steps == 40.0 and r.data_wait == 0.3
    assert r.processes == (1, 2) and r.straggler is None and r.burst is None and not r.collecting
    found = Straggler(1, 101, 0, 0.3, "critical", "data", 40.0, "dataloader-bound", "", None)
    assert reading_of(replace(STEPPING, straggler=found)).straggler == 101
    hook = HookState(99.0, 7, 8, 8, 0.0, 0.0, record=hook_record(7, burst={"state": "armed", "count": 2}))
    assert reading_of(STEPPING, focus_hook=hook).burst == "armed:2"


def test_the_reading_is_collecting_while_the_training_starts() -> None:
    first = reading_of(Analysis(t=2.0, features={"data_wait_share": 0.5}))  # no verdict yet
    assert first.collecting and first.top_finding is None and first.data_wait == 0.5
    assert reading_of(Analysis(t=3.0, features={}, verdict=IDLE), hook=Status.STARTING).collecting
    assert reading_of(Analysis(t=3.0, features={"hook_steps_per_s": 0.0}, verdict=IDLE)).collecting
    assert not reading_of(Analysis(t=3.0, features={"hook_steps_per_s": 2.0}, verdict=IDLE)).collecting
    importing = Analysis(t=3.0, features={"startup_share": 0.9}, verdict=IDLE)
    assert reading_of(importing, hook=Status.UNAVAILABLE).collecting  # py-spy sees it import
    assert not reading_of(replace(importing, features={"startup_share": 0.1}), hook=Status.UNAVAILABLE).collecting


def test_the_reading_is_filling_until_a_window_has_passed_since_the_first_step() -> None:
    def first_step(t: float) -> HookState:
        return HookState(99.0, 7, 8, 8, 0.0, 0.0, first_step_t=t)

    filling = reading_of(STEPPING, focus_hook=first_step(95.0), now=100.0)
    assert filling.filling and not filling.collecting  # the verdict holds; its readings climb
    assert not reading_of(STEPPING, focus_hook=first_step(89.0), now=100.0).filling
    assert not reading_of(STEPPING, focus_hook=first_step(0.0), now=100.0).filling  # not stepped: the hook rule


def test_the_evaluations_of_a_filling_window_count_but_are_no_reference() -> None:
    policy = CadencePolicy()
    filling = replace(BASE, filling=True, confidence=0.5)  # the evidence still gathering
    for _ in range(SETTLE_EVALUATIONS + 5):  # a whole window of it: still fast
        assert policy.update(filling).mode == FAST
    modes = [policy.update(BASE).mode for _ in range(REFERENCE_READINGS)]  # windows that are all steps
    assert modes == [FAST] * (REFERENCE_READINGS - 1) + [STEADY]  # the streak counted the filling ones
    # the confidence's settled low is of the full windows (0.9), not the filling ones' 0.5
    weaker = replace(BASE, confidence=0.75)
    modes = [policy.update(weaker).mode for _ in range(SHIFT_HOLD)]
    assert modes == [STEADY] * (SHIFT_HOLD - 1) + [FAST] and "weakened" in policy.reason


# -- the pacer: the policy for the session's threads ----------------------------------------------
class Sources:
    """Stands for the session's sources: records every cadence applied to them."""

    def __init__(self) -> None:
        self.applied: list[Cadence] = []

    def apply(self, c: Cadence) -> None:
        self.applied.append(c)


def settle(pacer: Pacer, now: float) -> None:
    for _ in range(SETTLE_EVALUATIONS):
        pacer.update(BASE, now)


def test_the_pacer_applies_each_new_cadence_and_keeps_the_changes_and_the_steady_time() -> None:
    sources = Sources()
    pacer = Pacer(CadencePolicy(), sources.apply, started=1000.0)
    assert [c.mode for c in sources.applied] == [FAST] and pacer.generation == 1  # at once
    settle(pacer, now=1012.0)
    assert [c.mode for c in sources.applied] == [FAST, STEADY] and pacer.generation == 2
    assert pacer.cadence.mode == STEADY and pacer.view(1015.0).steady_s == 3.0
    pacer.wake("a key was pressed in the TUI", now=1020.0)
    pacer.wake("a key was pressed in the TUI", now=1021.0)  # already fast: nothing applied
    view = pacer.view(1030.0)
    assert [c.mode for c in sources.applied] == [FAST, STEADY, FAST] and pacer.generation == 3
    assert view.mode == FAST and view.steady_s == 8.0 and view.returns_to_fast == 1
    assert [(c.t, c.mode) for c in view.changes] == [(12.0, STEADY), (20.0, FAST)]
    assert view.changes[-1].reason == view.reason == "a key was pressed in the TUI"


def test_the_pacer_keeps_the_last_changes_only() -> None:
    pacer = Pacer(CadencePolicy(settle=1), Sources().apply, started=0.0)
    for i in range(CHANGES_KEPT + 10):
        pacer.update(BASE, float(i))
        pacer.wake("flapping", float(i) + 0.5)
    changes = pacer.view(1000.0).changes
    assert len(changes) == CHANGES_KEPT and changes[-1].t == CHANGES_KEPT + 9.5


def test_a_pacer_not_adaptive_stays_fast() -> None:
    sources = Sources()
    pacer = Pacer(CadencePolicy(), sources.apply, started=0.0, adaptive=False)
    settle(pacer, now=12.0)
    pacer.wake("a key was pressed in the TUI")
    view = pacer.view(20.0)
    assert [c.mode for c in sources.applied] == [FAST] and view.mode == FAST and view.changes == ()
    assert view.reason == "adaptive cadence off"


def test_a_nap_ends_when_the_cadence_changes_or_watching_stops() -> None:
    pacer = Pacer(CadencePolicy(), Sources().apply, started=0.0)
    stop = threading.Event()
    napped: list[float] = []

    def nap() -> None:
        t0 = time.monotonic()
        pacer.nap(20.0, stop)
        napped.append(time.monotonic() - t0)

    def settling() -> None:
        settle(pacer, 12.0)

    def stopping() -> None:
        stop.set()
        pacer.interrupt()

    for end in (settling, stopping):
        sleeper = threading.Thread(target=nap)
        sleeper.start()
        time.sleep(0.2)
        end()
        sleeper.join(5)
        assert not sleeper.is_alive()
    assert len(napped) == 2 and all(0.1 < s < 5.0 for s in napped)
    t0 = time.monotonic()
    pacer.nap(0.05, threading.Event())  # nothing happens: the whole nap
    assert time.monotonic() - t0 >= 0.05
