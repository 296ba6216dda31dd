"""torchwatch.analysis.progress on synthetic hook readings: the epoch and its time left, the loss
series, and the three health rules (fire / silent / not applicable) through the diagnosis,
which never lets them change the verdict."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from torchwatch.analysis import progress
from torchwatch.analysis.diagnosis import Diagnoser
from torchwatch.analysis.features import CATALOGUE, Features
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.analysis.store import Store
from torchwatch.faces import report
from torchwatch.faces.headless import status_line
from torchwatch.faces.prometheus import ObservationCollector
from torchwatch.model.observation import Observation, TargetView
from torchwatch.model.readings import HookState, SourceStatus
from torchwatch.model.report import Report
from torchwatch.watch.observe import Tick, Trends, observe
from torchwatch.wire import LOSS_HISTORY, HookRecord, Instance, LossSample, ProgressInfo, UpdateInfo

RULES = {r.id: r for r in load_rules()}
HEALTH = ("loss-not-finite", "loss-spike", "loss-stalled")
PID = 4242
HZ = 4  # the hook's loss readings per second


def readings(
    seconds: float,
    loss: Callable[[int, float], float] | None,
    epoch_len: int | None = 100,
    steps_per_s: float = 10.0,
    note: str = "",
) -> list[HookState]:
    """One ``hook.json`` read a second for ``seconds``, of a training that takes ``steps_per_s``
    batches a second (an epoch of ``epoch_len``) and whose hook reads ``loss(step, t)`` 4 times a
    second (``None``: no loss)."""
    samples: list[LossSample] = []
    first_bad: LossSample | None = None
    out = []
    for k in range(int(seconds * HZ) + 1):
        t = k / HZ
        step = int(t * steps_per_s) + 1
        if loss is not None:
            s = LossSample(step, t, loss(step, t))
            samples.append(s)
            if first_bad is None and not math.isfinite(s.value):
                first_bad = s
        if k % HZ:
            continue
        taken = step if epoch_len is None else (step - 1) % epoch_len + 1
        epoch = 1 if epoch_len is None else (step - 1) // epoch_len + 1
        info = ProgressInfo(epoch, taken, epoch_len, tuple(samples[-LOSS_HISTORY:]), first_bad, note)
        record = HookRecord(Instance(PID, 1, 1), "3.12", "2.13", 0.0, 12, True, progress=info)
        out.append(HookState(t + 0.01, PID, step, step, 0.0, 0.0, record=record))
    return out


def noisy(level: float, spread: float = 0.05, seed: int = 1) -> Callable[[int, float], float]:
    rng = random.Random(seed)
    return lambda step, t: level * (1 + spread * rng.uniform(-1, 1))


def feats(reads: list[HookState]) -> Features:
    f: Features = dict.fromkeys(CATALOGUE)
    f.update({"stack_samples": 100.0, "thread_samples": 50.0})
    f.update(progress.features(reads, PID, reads[-1].t))
    return f


def health(reads: list[HookState], others: Features | None = None) -> tuple[set[str], set[str], Diagnoser]:
    """(the health findings, the health rules not applicable) after the readings held 11 s."""
    d = Diagnoser([RULES[r] for r in HEALTH])
    f = {**feats(reads), **(others or {})}
    d.evaluate(f, 0.0)
    a = d.evaluate(f, 11.0)
    return {x.rule for x in a.findings}, {n.rule for n in a.not_applicable}, d


# -- progress -----------------------------------------------------------------------------------


def test_the_epoch_and_its_time_left_come_from_the_batch_rate() -> None:
    # 10 batches/s, epochs of 100: at t=25 s, epoch 3, 51 batches taken, 49 to come: 4.9 s
    view = progress.progress(readings(25, noisy(1.0)), PID, 25.01)
    assert view is not None
    assert (view.epoch, view.batch, view.epoch_len) == (3, 51, 100)
    assert view.batches_per_s == pytest.approx(10.0, rel=0.05)
    assert view.eta_s == pytest.approx(4.9, rel=0.1)
    assert "epoch 3 · 51/100" in view.line() and "left" in view.line()


def test_an_unknown_length_says_so_and_gives_no_time_left() -> None:
    view = progress.progress(readings(10, noisy(1.0), epoch_len=None), PID, 10.01)
    assert view is not None and view.eta_s is None and view.epoch_len is None
    assert "no length" in view.unknown and "time left unknown" in view.line()


def test_no_loss_says_why() -> None:
    note = "backward() with gradient=/grad_tensors: no loss is read (the tensor is not a loss)"
    view = progress.progress(readings(5, None, note=note), PID, 5.01)
    assert view is not None and view.loss is None and view.loss_words() == f"no loss: {note}"


def test_the_loss_series_merges_every_reading_by_step() -> None:
    reads = readings(30, lambda step, t: 1.0 / step)
    view = progress.progress(reads, PID, 30.01)
    assert view is not None and view.loss_step == 301 and view.loss == pytest.approx(1 / 301)
    assert 6 <= len(view.loss_series) <= 7  # 5 s medians over 30 s
    assert view.loss_series[0] > 0.02  # the first seconds' readings: only the first records hold them
    assert view.loss_trend_per_min is not None and view.loss_trend_per_min < 0


# -- the health rules on readings -----------------------------------------------------------------


def test_loss_not_finite_fires_with_the_step_and_the_label_stays() -> None:
    reads = readings(20, lambda step, t: math.nan if step >= 120 else 1.0)
    f = feats(reads)
    assert (f["loss_nonfinite"], f["loss_nonfinite_step"]) == (1.0, 121)  # read at 4 Hz: 12.0 s -> step 121
    assert f["loss_last_finite_step"] == 118  # the reading before, 0.25 s earlier
    # beside a deciding finding: the label, its confidence and its summary are those without it
    deciding = {"data_wait_share": 0.6, "data_wait_queue_share": 0.6, "workers_running_fraction": 0.9}
    d = Diagnoser(list(RULES.values()))
    plain = Diagnoser(list(RULES.values()))
    for t in (0.0, 11.0):
        with_nan = d.evaluate({**f, **deciding}, t)
        without = plain.evaluate({**feats(readings(20, noisy(1.0))), **deciding}, t)
    assert "loss-not-finite" in {x.rule for x in with_nan.findings}
    assert with_nan.verdict == without.verdict
    assert with_nan.findings[-1].rule == "loss-not-finite"  # listed after the speed findings
    found, _, _ = health(reads)
    assert found == {"loss-not-finite"}


def test_loss_not_finite_alone_leaves_the_verdict_as_without_it() -> None:
    bad = health(readings(20, lambda step, t: math.inf if step >= 50 else 1.0))[2]._last
    good = health(readings(20, noisy(1.0)))[2]._last
    assert bad is not None and good is not None and bad == good


def test_a_jump_beyond_the_spread_is_a_spike_and_noise_is_not() -> None:
    level = noisy(1.0, 0.05)
    spiked = readings(70, lambda step, t: 4.0 if t >= 67 else level(step, t))
    found, _, _ = health(spiked)
    assert found == {"loss-spike"}
    assert feats(spiked)["loss_spike_step"] == 671
    found, not_applicable, _ = health(readings(70, noisy(1.0, 0.3)))  # heavy noise, no jump
    assert "loss-spike" not in found and "loss-spike" not in not_applicable


def test_a_spike_needs_a_minute_before_it() -> None:
    _, not_applicable, _ = health(readings(3, noisy(1.0)))
    assert "loss-spike" in not_applicable


def test_a_flat_loss_for_two_minutes_is_stalled_and_a_falling_one_is_not() -> None:
    found, _, _ = health(readings(125, noisy(0.7, 0.1)))
    assert found == {"loss-stalled"}
    found, not_applicable, _ = health(readings(125, lambda step, t: 2.0 * math.exp(-t / 200) + noisy(0, 0)(step, t)))
    assert "loss-stalled" not in found and "loss-stalled" not in not_applicable


def stall_finding(reads: list[HookState]) -> Any:
    """The ``loss-stalled`` finding after the readings held 11 s (``None``: not found)."""
    d = Diagnoser([RULES["loss-stalled"]])
    f = feats(reads)
    d.evaluate(f, 0.0)
    return next((x for x in d.evaluate(f, 11.0).findings if x.rule == "loss-stalled"), None)


def still(reads: list[HookState], why: str, from_t: float, steps_per_s: float = 10.0) -> list[HookState]:
    """``reads`` whose records say, from ``from_t`` on, that the optimizer's steps change no
    parameter for ``why`` (before: they change one)."""
    out = []
    for h in reads:
        assert h.record is not None and h.record.progress is not None
        t = h.t - 0.01
        s = t - from_t if why and t >= from_t else 0.0
        info = UpdateInfo(6, 0 if why == "no-grad" else 6, 0.0 if why == "lr-zero" else 0.01, int(s * steps_per_s), s)
        info = dataclasses.replace(info, why=why if t >= from_t else "")
        record = dataclasses.replace(h.record, progress=dataclasses.replace(h.record.progress, updates=info))
        out.append(dataclasses.replace(h, record=record))
    return out


@pytest.mark.parametrize(("why", "words"), [("no-grad", "has a gradient"), ("lr-zero", "learning rate is 0")])
def test_steps_that_change_no_parameter_are_a_stall_within_half_a_minute_whatever_the_noise(
    why: str, words: str
) -> None:
    noisy_flat = noisy(0.7, 0.5)  # +-50 %: two minutes of it cannot tell flat from falling
    found, _, _ = health(still(readings(30, noisy_flat), why, 5.0))  # 25 s still
    assert found == {"loss-stalled"}
    finding = stall_finding(still(readings(30, noisy_flat), why, 5.0))
    assert words in finding.summary and "optimizer steps in 25 s changed no parameter" in finding.summary
    assert "Or stop: it has converged" not in [f.title for f in finding.fixes], finding.fixes
    found, not_applicable, _ = health(still(readings(30, noisy_flat), why, 15.0))  # 15 s: not yet
    assert "loss-stalled" not in found and "loss-stalled" in not_applicable  # (the loss: < 2 min)


def test_steps_that_change_parameters_leave_the_stall_to_the_loss() -> None:
    falling = readings(130, lambda step, t: 2.0 * math.exp(-t / 200))
    found, not_applicable, _ = health(still(falling, "", 0.0))
    assert "loss-stalled" not in found and "loss-stalled" not in not_applicable
    finding = stall_finding(still(readings(125, noisy(0.7, 0.1)), "", 0.0))
    assert finding is not None and "the loss has not moved in 2 minutes" in finding.summary, finding


def test_stalled_is_not_said_before_two_minutes_of_loss() -> None:
    _, not_applicable, _ = health(readings(60, noisy(0.7, 0.1)))
    assert "loss-stalled" in not_applicable


def test_without_a_loss_every_health_rule_is_not_applicable() -> None:
    found, not_applicable, _ = health(readings(130, None))
    assert found == set() and not_applicable == set(HEALTH)


# -- the faces ------------------------------------------------------------------------------------


def _observed(reads: list[HookState]) -> Observation:
    """The session's Observation of ``reads`` (training PID 4242), with its analysis."""
    store = Store()
    store.add(reads)
    end = reads[-1].t
    d = Diagnoser(list(RULES.values()), why_missing=lambda name: "not read")
    d.evaluate(feats(reads), end - 11.0)
    tick = Tick(
        now=end,
        end=end,
        started=0.0,
        window_s=10.0,
        analysis=d.evaluate(feats(reads), end),
        statuses=(("hook", SourceStatus.ok()),),
        focus_pid=PID,
        target=TargetView(PID, ("python", "train.py")),
    )
    return observe(store, tick, Trends())


def _metrics(obs: Observation) -> dict[str, float]:
    """``{sample name: value}`` of one Prometheus exposition of ``obs`` (serve's collector)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ObservationCollector(lambda: [obs], "node1"))
    return {
        s.name: s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }


def test_the_report_status_line_and_metrics_show_progress_and_loss() -> None:
    obs = _observed(readings(25, lambda step, t: math.nan if step >= 200 else 1.0))
    data = report.build(obs, watched_s=25.0).to_json()
    p: dict[str, Any] = data["progress"]  # type: ignore[assignment]
    assert (p["epoch"], p["batch"], p["epoch_len"], p["loss"], p["nonfinite_step"]) == (3, 51, 100, None, 201)
    assert p["eta_s"] == pytest.approx(4.9, rel=0.1)
    schema = json.loads((Path(__file__).resolve().parent / "report_schema.json").read_text())
    jsonschema.validate(json.loads(json.dumps(data, allow_nan=False)), schema)
    back = Report.from_json(json.loads(json.dumps(data)))
    assert back.progress is not None and back.progress.nonfinite_step == 201
    text = report.render_text(back)
    assert "progress: epoch 3 · 51/100" in text and "loss not finite since step 201" in text
    assert "loss-not-finite" in text
    line = status_line(obs, 25.0)
    assert "epoch 3 · 51/100" in line and "health: loss-not-finite" in line
    got = _metrics(obs)
    assert got["torchwatch_epoch"] == 3 and math.isnan(got["torchwatch_loss"])
    assert got["torchwatch_eta_seconds"] == pytest.approx(4.9, rel=0.1)


def test_a_report_without_progress_has_no_key_and_loads() -> None:
    obs = _observed(readings(5, None))
    assert obs.focus.progress is not None and obs.focus.progress.loss is None  # no loss, an epoch
    tick_less = report.build(_observed_without_hook(), watched_s=5.0).to_json()
    assert "progress" not in tick_less and Report.from_json(tick_less).progress is None


def _observed_without_hook() -> Observation:
    tick = Tick(
        now=5.0,
        end=5.0,
        started=0.0,
        window_s=10.0,
        analysis=None,
        statuses=(),
        focus_pid=PID,
        target=TargetView(PID, ("python",)),
    )
    return observe(Store(), tick, Trends())


# -- tqdm bars ----------------------------------------------------------------------------------


def _with_bars(reads: list[HookState], bars: tuple[Any, ...]) -> list[HookState]:
    from dataclasses import replace

    last = reads[-1]
    assert last.record is not None and last.record.progress is not None
    record = replace(last.record, progress=replace(last.record.progress, bars=bars))
    return [*reads[:-1], replace(last, record=record)]


def test_the_outermost_bar_gives_the_runs_share_with_the_bar_inside_it() -> None:
    from torchwatch.wire import BarInfo

    epochs, batches = BarInfo(2.0, 5.0, "Epochs", 100.0, 0), BarInfo(25.0, 50.0, "batches", 20.0, 1)
    got = progress.bar_progress((epochs, batches))
    assert got is not None and got[0] == epochs
    assert got[1] == pytest.approx(0.5) and got[2] == pytest.approx(100.0)  # 2.5 of 5 epochs in 100 s
    fresh = BarInfo(0.0, 5.0, "Epochs", 3.0, 0)
    assert progress.bar_progress((fresh,)) == (fresh, 0.0, None)  # nothing done: no pace, no time left
    assert progress.bar_progress((BarInfo(7.0, None, "it", 3.0, 0),)) is None  # no total: nothing to say
    done = progress.bar_progress((BarInfo(5.0, 5.0, "Epochs", 90.0, 0), batches))
    assert done is not None and done[1:] == (1.0, 0.0)  # an ended outer bar: its inner bar adds nothing


def test_the_view_names_the_bar_and_keeps_it_once_closed() -> None:
    from torchwatch.wire import BarInfo

    reads = readings(20, noisy(1.0))
    shown = _with_bars(reads[:-1], (BarInfo(3.0, 10.0, "Epochs", 60.0, 0),)) + reads[-1:]  # closed at the end
    view = progress.progress(shown, PID, shown[-1].t)
    assert view is not None
    # 140 s left when the record was made, a second before now
    assert (view.bar_desc, view.bar_n, view.bar_total, view.bar_eta_s) == ("Epochs", 3.0, 10.0, pytest.approx(139.0))
    assert view.bar_words() == 'tqdm "Epochs" 3/10 · 2 min 19 s left'
    assert 'tqdm "Epochs" 3/10' in view.line()
    plain = progress.progress(reads, PID, reads[-1].t)
    assert plain is not None and plain.bar_total is None and plain.bar_words() == "" and "tqdm" not in plain.line()


def test_the_bars_time_left_is_at_its_recent_pace_not_a_slow_starts() -> None:
    """2 epochs of 10 in the bar's first 100 s (a slow start), then 1 every 20 s: 7 epochs to go
    take 140 s at the recent pace (the average since the start would say 280 s)."""
    from dataclasses import replace

    from torchwatch.wire import BarInfo

    shown = []
    for h in readings(20, noisy(1.0)):
        x = 2.0 + (h.t - 0.01) / 20.0  # epochs done
        bars = (BarInfo(float(int(x)), 10.0, "Epochs", 100.0 + h.t, 0), BarInfo(round(x % 1 * 100), 100.0, "", 1.0, 1))
        assert h.record is not None and h.record.progress is not None
        shown.append(replace(h, record=replace(h.record, progress=replace(h.record.progress, bars=bars))))
    view = progress.progress(shown, PID, shown[-1].t)
    assert view is not None and view.bar_share == pytest.approx(0.3)
    assert view.bar_eta_s == pytest.approx(140.0, rel=0.02)
    view = progress.progress(shown[-1:], PID, shown[-1].t)
    assert view is not None and view.bar_eta_s == pytest.approx(120.0 * 0.7 / 0.3, rel=1e-3)  # one reading: average
    moved = [replace(h, t=h.t + 5.0 * (h is shown[-1])) for h in shown]  # the last bar started 5 s later: another
    view = progress.progress(moved, PID, moved[-1].t)
    assert view is not None and view.bar_eta_s == pytest.approx(120.0 * 0.7 / 0.3, rel=1e-3)


def test_the_report_status_line_and_metrics_show_the_bar() -> None:
    from torchwatch.wire import BarInfo

    reads = _with_bars(readings(25, noisy(1.0)), (BarInfo(4.0, 10.0, "Epochs", 50.0, 0),))
    obs = _observed(reads)
    data = report.build(obs, watched_s=25.0).to_json()
    p: dict[str, Any] = data["progress"]  # type: ignore[assignment]
    assert (p["bar_desc"], p["bar_n"], p["bar_total"], p["bar_share"]) == ("Epochs", 4, 10, 0.4)
    assert p["bar_eta_s"] == pytest.approx(75.0, rel=1e-3)
    schema = json.loads((Path(__file__).resolve().parent / "report_schema.json").read_text())
    jsonschema.validate(json.loads(json.dumps(data, allow_nan=False)), schema)
    back = Report.from_json(json.loads(json.dumps(data)))
    assert back.progress is not None and back.progress.bar_total == 10
    assert 'tqdm "Epochs" 4/10 · 1 min 15 s left' in report.render_text(back)
    assert 'tqdm "Epochs" 4/10' in status_line(obs, 25.0)
    got = _metrics(obs)
    assert got["torchwatch_progress_bar_done_ratio"] == pytest.approx(0.4)
    assert got["torchwatch_progress_bar_eta_seconds"] == pytest.approx(75.0, rel=1e-3)


def test_the_epochs_time_left_is_as_of_now_not_of_the_hooks_last_record() -> None:
    """The hook rewrites its progress every 2 s at most: a record made 1.5 s before torchwatch read
    it leaves 1.5 s less than its batch says (the record says when it was made)."""
    from dataclasses import replace

    reads = readings(12, noisy(1.0))
    fresh = progress.progress(reads, PID, reads[-1].t)
    made = []
    for h in reads:
        assert h.record is not None and h.record.progress is not None
        made.append(replace(h, record=replace(h.record, progress=replace(h.record.progress, at=h.t - 1.5))))
    late = progress.progress(made, PID, made[-1].t)
    assert fresh is not None and late is not None and fresh.eta_s is not None and late.eta_s is not None
    assert late.eta_s == pytest.approx(fresh.eta_s - 1.5, abs=1e-6)
    foreign = [replace(h, record=replace(h.record, progress=replace(h.record.progress, at=h.t + 1e6))) for h in made]
    other = progress.progress(foreign, PID, foreign[-1].t)  # not on torchwatch's clock: the read's time
    assert other is not None and other.eta_s == pytest.approx(fresh.eta_s, abs=1e-6)
