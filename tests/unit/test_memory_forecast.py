"""The memory forecast's statistics (torchwatch.model.forecast): truth by construction."""

from __future__ import annotations

import math
import random

import pytest

from torchwatch.model import forecast as fc

MIB = float(1 << 20)


def _series(fn, seconds: float, dt: float = 1.0, noise: float = 0.0, seed: int = 0) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    n = int(seconds / dt)
    return [(i * dt, fn(i * dt) + rng.gauss(0.0, noise)) for i in range(n)]


def test_theil_sen_interval_holds_the_true_slope_and_ignores_outliers():
    pts = _series(lambda t: 5.0 * t, 100, noise=20.0, seed=3)
    pts[10] = (10.0, 1e9)  # one wild reading
    slope, lo, hi = fc.theil_sen(pts)
    assert lo <= 5.0 <= hi
    assert slope == pytest.approx(5.0, rel=0.1)
    with pytest.raises(ValueError):
        fc.theil_sen([(1.0, 2.0), (1.0, 3.0)])


def test_a_steady_rise_gives_the_time_to_the_limit_within_ten_percent():
    # 1 GiB limit, 300 MiB used, +4 MiB/s with GC dips every 7 s: 700 MiB left -> 175 s
    base = 300 * MIB

    def used(t: float) -> float:
        return base + 4 * MIB * t - (30 * MIB if int(t) % 7 == 0 else 0.0)

    pts = _series(used, 90, noise=2 * MIB, seed=1)
    f = fc.forecast(pts, 1024 * MIB)
    assert f is not None
    truth = (1024 * MIB - used(89)) / (4 * MIB)
    assert f.seconds == pytest.approx(truth, rel=0.1)
    assert f.soonest <= f.seconds <= f.latest


def test_no_forecast_before_sixty_seconds_of_rise():
    pts = _series(lambda t: 300 * MIB + 4 * MIB * t, 50)
    tr = fc.trend(pts, 1024 * MIB)
    assert tr is not None and not tr.real and "60 s" in tr.why
    assert fc.forecast(pts, 1024 * MIB) is None


@pytest.mark.parametrize("tau", [10.0, 20.0, 30.0])
def test_a_start_up_ramp_that_levels_off_is_not_a_trend(tau):
    # 2 GiB loaded with time constant tau, then flat: evaluated every 5 s for 10 minutes
    pts = _series(lambda t: 500 * MIB + 2048 * MIB * (1 - math.exp(-t / tau)), 600, noise=1 * MIB, seed=2)
    for end in range(60, 600, 5):
        assert fc.forecast(pts[:end], 8192 * MIB) is None, end


def test_a_flat_training_with_epochs_and_gc_never_gets_a_forecast():
    # epochs of 45 s: workers fork (+600 MiB over 10 s), touch pages (+120 MiB), exit (-720 MiB);
    # GC dips and noise. Ten minutes, evaluated every 5 s as the watcher does: 0 forecasts.
    def used(t: float) -> float:
        e = t % 45.0
        workers = 600 * MIB * min(1.0, e / 10.0) + 120 * MIB * (e / 45.0)
        gc = -40 * MIB if int(t) % 11 == 0 else 0.0
        return 1500 * MIB + workers + gc

    pts = _series(used, 600, noise=3 * MIB, seed=4)
    alarms = [end for end in range(12, 600, 5) if fc.forecast(pts[:end], 4096 * MIB) is not None]
    assert alarms == []


def test_a_rise_too_small_to_matter_is_not_forecast():
    pts = _series(lambda t: 1000 * MIB + 0.2 * MIB * t, 120)  # 24 MiB in 2 min
    tr = fc.trend(pts, 64 * 1024 * MIB)
    assert tr is not None and not tr.real and "below" in tr.why


def test_a_limit_beyond_the_horizon_is_not_shown():
    pts = _series(lambda t: 1000 * MIB + 1 * MIB * t, 120)
    assert fc.forecast(pts, 1e15) is None
    assert fc.forecast(pts, 4096 * MIB) is not None


def test_a_rise_after_a_start_up_ramp_is_found_in_the_recent_window():
    # 0-90 s: a dataset is built (+1.5 GiB, fast then slow), then workers copy it at 6 MiB/s
    def used(t: float) -> float:
        ramp = 1536 * MIB * (1 - math.exp(-t / 25.0))
        return 200 * MIB + ramp + (6 * MIB * (t - 90.0) if t > 90 else 0.0)

    pts = _series(used, 250, noise=2 * MIB, seed=5)
    f = fc.forecast(pts, 3000 * MIB)
    assert f is not None
    truth = (3000 * MIB - used(249)) / (6 * MIB)
    assert f.seconds == pytest.approx(truth, rel=0.15)
