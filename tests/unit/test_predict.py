"""torchwatch.analysis.predict: the speed-up each fix should buy, on recorded and synthetic windows."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.featuresets import consistent
from torchwatch.analysis import predict
from torchwatch.analysis.diagnosis import Diagnoser, template_values
from torchwatch.analysis.features import CATALOGUE, PROGRESS_FEATURES, WATCH_FEATURES, Features
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.faces import report
from torchwatch.model.findings import Fix
from torchwatch.model.predicted import Predicted
from torchwatch.model.report import Report

RULES = {r.id: r for r in load_rules()}
WINDOWS = Path(__file__).resolve().parent.parent / "fixtures" / "windows"
ENOUGH = {"stack_samples": 200.0, "thread_samples": 100.0}


def features(**values: float | None) -> Features:
    f: Features = {name: None for name in CATALOGUE}
    f.update(ENOUGH)
    for name, value in consistent(values).items():
        assert name in CATALOGUE, name
        f[name] = value
    return f


def recorded(name: str) -> tuple[Features, dict[str, Any]]:
    """A recorded window's features and its provenance (tests/fixtures/windows/). A feature the
    catalogue gained since the recording reads as ``None`` (not measured then); a name the
    catalogue does not have fails: the fixture was recorded with another catalogue."""
    data = json.loads((WINDOWS / f"{name}.json").read_text())
    unknown = set(data["features"]) - (set(CATALOGUE) - WATCH_FEATURES - PROGRESS_FEATURES)
    assert not unknown, f"recorded with another catalogue: {sorted(unknown)}"
    return {**dict.fromkeys(CATALOGUE), **data["features"]}, data


def sane(p: Predicted) -> Predicted:
    """``p`` after checking it is a prediction whose interval holds its ratio."""
    assert p.ratio is not None and p.low is not None and p.high is not None, p
    assert 0 < p.low <= p.ratio <= p.high, p
    assert p.reason
    return p


# -- num_workers=0 -> k: the main thread fetches, the pipeline takes it off -----------------------------
# The main thread fetches 60 % of the step, all of it on a CPU, on 8 usable CPUs; the loop's own
# work is the other 40 %, one core.
_MAIN_FETCH: dict[str, Any] = {
    "data_wait_share": 0.6,
    "data_wait_fetch_share": 0.6,
    "data_wait_queue_share": 0.0,
    "fetch_cpu_share": 0.6,
    "main_cpu_pct": 100.0,
    "dl_num_workers": 0.0,
    "worker_count": 0.0,
    "usable_cpus": 8.0,
    "foreign_cpu_cores": 0.0,
    "own_cpu_cores": 0.1,
    "intra_op_threads": 1.0,
    "main_sleep_share": 0.0,
    "cpu_wait_share": 0.0,
}


def test_workers_take_the_fetch_off_the_main_thread() -> None:
    p = sane(predict.predict_kind("num_workers", features(**_MAIN_FETCH), 2.0))
    # C = 0.4, F = 0.6: 2 workers make 3.3 batches per T, the loop takes 2.5: consumer-bound, 2.5x
    assert p.ratio == pytest.approx(2.5, rel=0.01)
    assert p.low < 2.5 < p.high
    # 1 worker: one batch per 0.6 T, 1.67x; the knee (within 5 % of 2.5x) is 2 workers
    assert sane(predict.predict_kind("num_workers", features(**_MAIN_FETCH), 1.0)).ratio == pytest.approx(
        1 / 0.6, rel=0.01
    )
    assert p.knee == 2


def test_workers_cannot_use_cpus_the_machine_does_not_have() -> None:
    # the same loop on 2 usable CPUs beside 0.9 cores of others: 1.0 CPU left, and the step takes
    # 1.0 core x T (fetch included): the CPUs are full, workers move the work, they add no CPU
    f = features(**{**_MAIN_FETCH, "usable_cpus": 2.0, "foreign_cpu_cores": 0.9})
    p = sane(predict.predict_kind("num_workers", f, 4.0))
    assert p.ratio == pytest.approx(1.0, abs=0.01)
    assert predict.predict_kind("num_workers", f).knee == 1


def test_a_wait_on_a_timer_in_the_dataset_is_overlapped_by_workers_up_to_the_consumer() -> None:
    # sleepy_dataset's shape: the fetch sleeps (no CPU), the loop is 10 % of the step
    f = features(
        **{**_MAIN_FETCH, "data_wait_share": 0.9, "data_wait_fetch_share": 0.9, "fetch_cpu_share": 0.0,
           "fetch_other_wait_share": 0.9, "main_sleep_share": 0.9, "main_cpu_pct": 10.0}
    )  # fmt: skip
    p = sane(predict.predict_kind("num_workers", f, 4.0))
    assert p.ratio == pytest.approx(4 / 0.9, rel=0.01)  # 4 batches per 0.9 T, under the loop's 10 per T
    assert predict.predict_kind("num_workers", f).knee == 9  # ceil(0.95 x 10 x 0.9)


# workers already, the loop waits on them 50 % of the step, they run on a CPU all their producing time
_WORKERS: dict[str, Any] = {
    "data_wait_share": 0.5,
    "data_wait_queue_share": 0.5,
    "data_wait_fetch_share": 0.0,
    "fetch_cpu_share": 0.0,
    "dl_num_workers": 1.0,
    "worker_count": 1.0,
    "workers_busy_share": 1.0,
    "workers_running_fraction": 1.0,
    "workers_runqueue_fraction": 0.0,
    "workers_cpu_pct": 100.0,
    "main_cpu_pct": 50.0,
    "usable_cpus": 8.0,
    "foreign_cpu_cores": 0.0,
    "own_cpu_cores": 0.1,
    "intra_op_threads": 1.0,
    "main_sleep_share": 0.0,
    "cpu_wait_share": 0.0,
}


def test_more_workers_when_the_loop_waits_on_one() -> None:
    # one worker takes T per batch, the loop 0.5 T: 2 workers double the rate, 3 add nothing
    assert sane(predict.predict_kind("num_workers", features(**_WORKERS), 2.0)).ratio == pytest.approx(2.0, rel=0.01)
    assert sane(predict.predict_kind("num_workers", features(**_WORKERS), 3.0)).ratio == pytest.approx(2.0, rel=0.01)
    assert predict.predict_kind("num_workers", features(**_WORKERS)).knee == 2


def test_workers_that_wait_for_a_cpu_on_a_full_machine_are_not_helped_by_more() -> None:
    # aug_two_workers' shape: 2 CPUs, workers wait for a CPU a third of their time, the tree fills both
    f = features(
        **{**_WORKERS, "usable_cpus": 2.0, "dl_num_workers": 2.0, "worker_count": 2.0,
           "workers_runqueue_fraction": 0.33, "workers_cpu_pct": 170.0, "main_cpu_pct": 25.0}
    )  # fmt: skip
    p = sane(predict.predict_kind("num_workers", f, 4.0))
    assert p.ratio == pytest.approx(1.0, abs=0.05)


def test_no_wait_on_workers_is_nothing_to_predict_for_them() -> None:
    f = features(**{**_WORKERS, "data_wait_queue_share": 0.0, "data_wait_share": 0.0, "workers_busy_share": None})
    p = predict.predict_kind("num_workers", f, 4.0)
    assert p.ratio is None and "waits on no worker" in p.reason
    assert predict.predict_kind("num_workers", features(**{**_WORKERS, "usable_cpus": None})).ratio is None


# -- the other kinds -------------------------------------------------------------------------------------
def test_cache_removes_the_per_sample_cpu_work() -> None:
    main = sane(predict.predict_kind("cache", features(**_MAIN_FETCH)))
    assert main.ratio == pytest.approx(1 / 0.4, rel=0.01)
    workers = sane(predict.predict_kind("cache", features(**_WORKERS)))
    assert workers.ratio == pytest.approx(2.0, rel=0.01)  # the loop's 0.5 T is all that is left
    none = predict.predict_kind("cache", features(**{**_MAIN_FETCH, "fetch_cpu_share": 0.0}))
    assert none.ratio is None and "per-sample" in none.reason
    assert predict.predict_kind("cache", features(**{**_WORKERS, "workers_running_fraction": None})).ratio is None


def test_the_sleep_off_the_loop() -> None:
    p = sane(predict.predict_kind("sleep", features(main_sleep_share=0.8, thread_samples=100.0)))
    assert p.ratio == pytest.approx(5.0, rel=0.01)
    assert p.low < 4.0 and p.high > 6.0  # 100 thread samples: +-0.07 on the share
    assert predict.predict_kind("sleep", features(main_sleep_share=None)).ratio is None


def test_the_neighbour_gone_gives_back_the_wait_for_a_cpu() -> None:
    p = sane(predict.predict_kind("neighbour", features(cpu_wait_share=0.5, foreign_cpu_cores=1.0)))
    assert p.ratio == pytest.approx(2.0, rel=0.01)
    assert predict.predict_kind("neighbour", features(cpu_wait_share=None)).ratio is None


def test_the_quota_lifted_gives_back_the_throttled_time() -> None:
    p = sane(predict.predict_kind("quota", features(cpu_throttled_share=0.6)))
    assert p.ratio == pytest.approx(2.5, rel=0.01)
    assert predict.predict_kind("quota", features(cpu_throttled_share=None)).ratio is None


# 8 threads on 2 CPUs: the process uses 1.9 cores while it computes, its threads wait 40 % for a CPU
_OVERSUBSCRIBED: dict[str, Any] = {
    "intra_op_threads": 8.0,
    "usable_cpus": 2.0,
    "main_cpu_pct": 114.0,
    "cpu_wait_share": 0.4,
    "data_wait_share": 0.0,
    "foreign_cpu_cores": 0.0,
    "own_cpu_cores": 0.0,
}


def test_fewer_threads_than_cpus_lose_the_wait_at_the_barrier() -> None:
    two = sane(predict.predict_kind("threads", features(**_OVERSUBSCRIBED), 2.0))
    assert two.ratio == pytest.approx(1 / 0.6, rel=0.02)
    one = sane(predict.predict_kind("threads", features(**_OVERSUBSCRIBED), 1.0))
    assert one.ratio < two.ratio  # the parallel part runs on half the cores
    assert predict.predict_kind("threads", features(**{**_OVERSUBSCRIBED, "intra_op_threads": None})).ratio is None


def test_pinned_copies_need_a_burst_that_measured_them() -> None:
    p = sane(predict.predict_kind("pin_memory", features(burst_pageable_h2d_share=0.3, burst_gpu_idle_share=0.5)))
    # half the 0.3 copy share saved: 1.18x; all of it at best (1.43x, +10 % model error)
    assert p.ratio == pytest.approx(1 / 0.85, rel=0.01) and p.high == pytest.approx(1 / 0.7 * 1.1, rel=0.01)
    assert predict.predict_kind("pin_memory", features()).ratio is None
    with pytest.raises(ValueError, match="unknown fix kind"):
        predict.predict_kind("faster", features())


# -- which fix is which ----------------------------------------------------------------------------------
def test_every_kind_named_for_a_fix_is_a_shipped_rules_fix() -> None:
    for rule, title in predict.FIX_KINDS:
        assert rule in RULES, rule
        assert title in [fx.title for fx in RULES[rule].fixes], (rule, title)
    for rule in RULES.values():
        for fx in rule.fixes:
            if fx.trial:
                assert fx.trial.partition("=")[0] in predict.TRIAL_KINDS or fx.trial.startswith(
                    ("matmul_precision", "cudnn_benchmark")
                ), fx.trial


def test_fixes_the_model_cannot_predict_say_why() -> None:
    f = features(**_MAIN_FETCH)
    for rule, title, why in [
        ("storage-latency", "Issue more reads at once", "queue depth"),
        ("gpu-saturated", "Use bf16/fp16 autocast (AMP)", "GPU-bound"),
        ("loop-cpu", "Find the hot Python in the loop", "code"),
    ]:
        p = predict.predict_fix(rule, title, None, f)
        assert p.ratio is None and why in p.reason and p.kind == "none"
        assert p.text().startswith("not predicted: ")
    assert predict.predict_fix("cpu-contention", "x", "threads=1", f).kind == "threads"
    assert predict.predict_fix("loader-cpu-in-main-thread", "x", "num_workers=3", f).ratio == pytest.approx(2.5, 0.01)


# -- properties ------------------------------------------------------------------------------------------
shares = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@st.composite
def loops(draw: st.DrawFn) -> dict[str, Any]:
    fetch = draw(st.floats(min_value=0.01, max_value=0.99))
    return {
        **_MAIN_FETCH,
        "data_wait_share": fetch,
        "data_wait_fetch_share": fetch,
        "fetch_cpu_share": fetch * draw(shares),
        "main_cpu_pct": 100.0 * draw(st.floats(min_value=0.0, max_value=4.0)),
        "usable_cpus": float(draw(st.integers(min_value=1, max_value=64))),
        "foreign_cpu_cores": draw(st.floats(min_value=0.0, max_value=8.0)),
        "main_running_share": draw(shares),
        "main_runqueue_share": draw(shares),
    }


@settings(max_examples=60, deadline=None)
@given(loops())
def test_more_workers_never_predict_slower(values: dict[str, Any]) -> None:
    """The pipeline's rate never falls with more workers: the CPUs cap it, they do not lower it
    (a real loop beyond its CPUs can get slower: docs/predict.md)."""
    loop = predict.loop_of(features(**values))
    rates = [predict.workers_rate(loop, k) for k in range(1, 20)]
    assert all(r is not None for r in rates)
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(rates))  # type: ignore[operator]


@settings(max_examples=60, deadline=None)
@given(loops())
def test_the_knee_is_the_fewest_workers_within_5_percent_of_the_best(values: dict[str, Any]) -> None:
    loop = predict.loop_of(features(**values))
    rates = [predict.workers_rate(loop, k) or 0.0 for k in range(1, predict.MAX_WORKERS + 1)]
    best = max(rates)
    scanned = next(k for k, r in enumerate(rates, start=1) if r >= 0.95 * best - 1e-9)
    assert predict.knee(loop) == scanned


@settings(max_examples=60, deadline=None)
@given(shares, shares)
def test_a_larger_share_removed_never_predicts_less(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    for kind, name in (
        ("sleep", "main_sleep_share"),
        ("quota", "cpu_throttled_share"),
        ("neighbour", "cpu_wait_share"),
    ):
        p_lo = predict.predict_kind(kind, features(**{name: lo}))
        p_hi = predict.predict_kind(kind, features(**{name: hi}))
        assert p_lo.ratio is not None and p_hi.ratio is not None
        assert p_hi.ratio >= p_lo.ratio >= 1.0
        assert p_hi.low is not None and p_hi.high is not None and p_hi.low <= p_hi.ratio <= p_hi.high


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=16), st.floats(min_value=1.0, max_value=8.0), shares)
def test_threads_up_to_the_cpus_left_never_predict_slower(cpus: int, cores: float, wait: float) -> None:
    f = features(**{**_OVERSUBSCRIBED, "usable_cpus": float(cpus), "main_cpu_pct": 100 * cores, "cpu_wait_share": wait})
    ratios = [predict.predict_kind("threads", f, float(k)).ratio for k in range(1, cpus + 1)]
    assert all(r is not None for r in ratios)
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(ratios))  # type: ignore[operator]


# -- wiring: the diagnosis fills Fix.predicted, the report writes and shows it ---------------------------
def settle(f: Features) -> Any:
    d = Diagnoser(list(RULES.values()))
    d.evaluate(f, 0.0)
    return d.evaluate(f, 10.0)


def test_the_diagnosis_predicts_every_fix_and_the_report_carries_it() -> None:
    a = settle(features(**_MAIN_FETCH))
    finding = next(f for f in a.findings if f.rule == "loader-cpu-in-main-thread")
    by_title = {fx.title: fx.predicted for fx in finding.fixes}
    workers = by_title["Load data in DataLoader workers"]
    assert workers is not None and workers.kind == "num_workers" and workers.ratio == pytest.approx(2.5, rel=0.01)
    cache = by_title["Make each sample cheaper"]
    assert cache is not None and cache.kind == "cache" and cache.ratio == pytest.approx(2.5, rel=0.01)
    assert all(fx.predicted is not None for f in a.findings for fx in f.fixes)
    written = Fix("t", "d", "num_workers=7", workers).to_json()
    assert written["predicted"]["kind"] == "num_workers" and written["predicted"]["knee"] == 2
    assert "predicted" not in Fix("t", "d").to_json()


def test_the_text_report_shows_the_prediction_and_a_saved_report_keeps_it() -> None:
    today = json.loads((WINDOWS.parent / "reports" / "today.json").read_text())
    p = Predicted(kind="num_workers", ratio=2.1, low=1.7, high=2.5, reason="a pipeline", knee=3)
    today["findings"][0]["fixes"][0]["predicted"] = p.to_json()
    saved = Report.from_json(today)
    assert saved.findings[0].fixes[0].predicted == p
    assert Report.from_json(saved.to_json()) == saved
    assert "steps/s ≈ 2.1× (1.7–2.5×), knee num_workers=3" in report.render_text(saved)


# -- recorded windows ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["random_reads_workers", "reads_in_loop", "sequential_reads", "sequential_reads_workers"]
)
def test_recorded_storage_windows_say_why_storage_is_not_predicted(name: str) -> None:
    f, _ = recorded(name)
    a = settle(f)
    storage = [fx for x in a.findings if x.rule.startswith("storage-") for fx in x.fixes]
    assert storage
    for fx in storage:
        assert fx.predicted is not None and fx.predicted.ratio is None and "queue depth" in fx.predicted.reason


def test_template_values_carry_what_the_threads_fix_predicts() -> None:
    values = template_values(features(**{**_OVERSUBSCRIBED, "cpu_throttled_share": 0.4}))
    p = predict.predict_fix("cpu-quota-throttled", "Run no more threads than the quota", None, values)
    assert p.kind == "threads" and p.ratio is not None and math.isfinite(p.ratio)


# Recorded beside seven other sessions' builds (load average 7-13 on 2 cores): the loop waits for a
# CPU 51-68 % of the time in each, so cpu-contention comes first; the relief measured in separate
# runs under the same load is in each fixture (noisy: the right direction is what is checked).
def test_recorded_aug_one_worker_predicts_the_neighbour_and_the_cache() -> None:
    f, data = recorded("predict_aug_one_worker")
    a = settle(f)
    assert a.findings[0].rule == "cpu-contention"
    gone = next(fx for fx in a.findings[0].fixes if fx.title == "Give the training its CPUs").predicted
    assert gone is not None and gone.kind == "neighbour" and sane(gone).ratio > 1.5  # waits 51 % for a CPU
    cache = sane(predict.predict_kind("cache", f))  # the relief: samples augmented once, up front
    assert cache.ratio > 1.1 and data["measured_relief"] > 1.0  # the direction measured
    # others' runnable threads hold the CPUs: a second worker takes a fair share of its own (the
    # main thread ran 22 % of the time it was runnable), up to the loop's own rate, 1 / (1 - 0.33)
    two = sane(predict.predict_kind("num_workers", f, 2.0))
    assert 1.1 < two.ratio <= 1 / (1 - 0.3332) + 1e-3


@pytest.mark.parametrize("name", ["predict_sleepy_loop", "predict_sleepy_dataset"])
def test_recorded_sleeps_predict_a_gain_in_the_measured_direction(name: str) -> None:
    f, data = recorded(name)
    p = sane(predict.predict_kind("sleep", f))
    assert p.ratio > 1.0 and data["measured_relief"] > 1.0
    assert predict.predict_kind("pin_memory", f).ratio is None  # a CPU run: no burst, no copies


def test_recorded_sleepy_dataset_workers_overlap_the_fetch() -> None:
    f, _ = recorded("predict_sleepy_dataset")
    a = settle(f)
    finding = next(x for x in a.findings if x.rule == "loader-cpu-in-main-thread")
    workers = next(fx for fx in finding.fixes if fx.trial and fx.trial.startswith("num_workers="))
    assert workers.predicted is not None and sane(workers.predicted).ratio > 1.2 and workers.predicted.knee
    assert predict.predict_kind("cache", f).ratio is not None
    # no cgroup quota in the run, no thread count without the hook's threads record missing: say why
    assert "throttled" in predict.predict_kind("quota", f).reason


def test_one_thread_beside_a_neighbour_loses_the_barrier_wait_not_its_own() -> None:
    # 2 intra-op threads on 2 CPUs beside 1.5 cores of others: the thread that waited most for a
    # CPU waited 50 % (cpu_wait_share), the main thread itself 20 %: one thread meets no barrier
    f = features(
        intra_op_threads=2.0, usable_cpus=2.0, foreign_cpu_cores=1.5, own_cpu_cores=0.0, main_cpu_pct=90.0,
        cpu_wait_share=0.5, main_running_share=0.5, main_runqueue_share=0.2, data_wait_share=0.0,
    )  # fmt: skip
    one = sane(predict.predict_kind("threads", f, 1.0))
    assert one.ratio == pytest.approx(1 / 0.7, rel=0.01)
    # the main thread's own wait is all of it: no barrier to lose
    same = sane(predict.predict_kind("threads", {**f, "main_runqueue_share": 0.5}, 1.0))
    assert same.ratio == pytest.approx(1.0, abs=0.01)
    # the neighbour gone: the whole wait goes
    assert sane(predict.predict_kind("neighbour", f)).ratio == pytest.approx(2.0, rel=0.01)


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(predict.KINDS),
    st.dictionaries(
        st.sampled_from(
            ["data_wait_share", "data_wait_queue_share", "fetch_cpu_share", "workers_running_fraction",
             "workers_runqueue_fraction", "workers_busy_share", "cpu_wait_share", "main_sleep_share",
             "cpu_throttled_share", "main_running_share", "main_runqueue_share", "burst_pageable_h2d_share"]
        ),
        shares,
    ),
    st.integers(min_value=0, max_value=4),
)  # fmt: skip
def test_any_reading_gives_a_ratio_inside_its_interval_or_a_reason(
    kind: str, values: dict[str, float], workers: int
) -> None:
    f = features(**{**_MAIN_FETCH, **values, "dl_num_workers": float(workers), "worker_count": float(workers)})
    p = predict.predict_kind(kind, f, 2.0 if kind in ("num_workers", "threads") else None)
    if p.ratio is None:
        assert p.reason and p.low is None and p.high is None
    else:
        sane(p)
        assert math.isfinite(p.high)


@pytest.mark.parametrize("kind", ["num_workers", "cache", "neighbour", "sleep", "quota", "threads"])
def test_step_times_spread_wide_over_few_steps_widen_the_interval_but_never_below_zero(kind: str) -> None:
    """Beside two busy processes a report carried a low end of -0.06: the step time's spread
    (p95 ten times p50, one step a second) made the relative widening larger than 1."""
    wide = {"step_time_p50_ms": 50.0, "step_time_p95_ms": 500.0, "hook_steps_per_s": 1.0}
    calm = {"step_time_p50_ms": 50.0, "step_time_p95_ms": 55.0, "hook_steps_per_s": 20.0}
    base = {**_MAIN_FETCH, "cpu_wait_share": 0.3, "main_sleep_share": 0.2, "cpu_throttled_share": 0.2}
    value = 2.0 if kind in ("num_workers", "threads") else None
    p_wide = predict.predict_kind(kind, features(**{**base, **wide}), value)
    p_calm = predict.predict_kind(kind, features(**{**base, **calm}), value)
    if p_wide.ratio is None:
        pytest.skip(f"{kind}: {p_wide.reason}")
    sane(p_wide)
    sane(p_calm)
    assert p_wide.low is not None and p_calm.low is not None and p_wide.low < p_calm.low
    assert p_wide.high is not None and p_calm.high is not None and p_wide.high > p_calm.high


def test_a_cache_beside_one_busy_process_also_frees_the_cpu_the_loop_queued_for() -> None:
    # one worker on a CPU all its producing time, the loop waits on it 60 % of the step; beside one
    # busy process the loop's thread ran 0.2 and queued 0.1 (a share of 2/3: one other runnable
    # thread beside the loop and the worker on 2 CPUs). Cached, the worker leaves the run queue:
    # the loop's thread has a CPU whenever it is runnable, and the step is its 0.3 less that 0.1
    busy = {**_WORKERS, "data_wait_share": 0.6, "data_wait_queue_share": 0.6, "usable_cpus": 2.0, "main_cpu_pct": 20.0,
            "foreign_cpu_cores": 1.0, "main_running_share": 0.2, "main_runqueue_share": 0.1}  # fmt: skip
    assert sane(predict.predict_kind("cache", features(**busy))).ratio == pytest.approx(1 / 0.3, rel=0.01)
    alone = {**busy, "foreign_cpu_cores": 0.0}  # no others: the worker's CPU was not the loop's to take
    assert sane(predict.predict_kind("cache", features(**alone))).ratio == pytest.approx(1 / 0.4, rel=0.01)
