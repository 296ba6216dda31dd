"""A burst that names its start step: it waits for that step, numbers the profiler's steps as the
hook counts them, starts late when the step has passed, and gives up when it never comes.
The profiler is a stand-in (no torch): what is checked is the burst's state machine."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from torchwatch import wire
from torchwatch.hook import burst

INST = wire.Instance(123, 4567, 4026531836)


class FakeProfile:
    """What the burst uses of ``torch.profiler.profile``."""

    made: ClassVar[list[FakeProfile]] = []

    def __init__(self, schedule: Any = None, **kwargs: Any) -> None:
        self.schedule = schedule
        self.step_num = 0
        self.started_at_step: int | None = None
        self.steps = 0
        FakeProfile.made.append(self)

    def start(self) -> None:
        self.started_at_step = self.step_num

    def step(self) -> None:
        self.step_num += 1
        self.steps += 1

    def stop(self) -> None:
        pass


def fake_torch() -> Any:
    return SimpleNamespace(
        profiler=SimpleNamespace(
            profile=FakeProfile,
            schedule=lambda **kw: lambda n: ("schedule", kw, n),
            ProfilerActivity=SimpleNamespace(CPU="cpu", CUDA="cuda"),
            record_function=None,
        ),
        autograd=SimpleNamespace(_profiler_enabled=lambda: False),
        cuda=SimpleNamespace(is_initialized=lambda: False),
    )


@pytest.fixture
def burster(monkeypatch: pytest.MonkeyPatch) -> burst.Burster:
    FakeProfile.made.clear()
    b = burst.Burster(fake_torch(), INST, lambda: False, lambda: None, lambda n: [], lambda: 1)
    monkeypatch.setattr(b, "_finish", lambda now: setattr(b, "state", "summarizing"))
    return b


def test_a_burst_waits_for_its_start_step_and_numbers_steps_as_the_hook_does(burster: burst.Burster) -> None:
    assert burster.request(wire.BurstRequest(start_step=10), 100.0, True, "signal")
    for step in range(5, 10):
        burster.on_step(100.0 + step, step)
        assert burster.state == "armed" and burster._timer is not None  # waiting, its timer renewed
    burster.on_step(110.0, 10)
    assert burster.state == "running" and burster._first_step == 10
    (prof,) = FakeProfile.made
    assert prof.started_at_step == 10  # the trace's first mark: ProfilerStep#10
    # the schedule is offset alike: at its own step 0 when the hook is at step 10
    assert prof.schedule(10) == prof.schedule(0) == ("schedule", {"wait": 0, "warmup": 1, "active": 3, "repeat": 1}, 0)
    assert prof.schedule(12)[2] == 2
    burster._cancel_timer()


def test_a_rank_already_past_the_start_step_starts_at_once_and_says_where(burster: burst.Burster) -> None:
    assert burster.request(wire.BurstRequest(start_step=3, group="g"), 100.0, True, "signal")
    burster.on_step(101.0, 7)
    assert burster.state == "running" and burster._first_step == 7
    burster._cancel_timer()


def test_a_start_step_never_reached_gives_up_with_the_reason(burster: burst.Burster) -> None:
    assert burster.request(wire.BurstRequest(start_step=10**6), 100.0, True, "signal")
    burster.on_step(100.0 + burst.ARM_MAX_S + 1, 5)
    assert burster.state == "idle" and burster.last is not None
    assert burster.last.error is not None and "not reached" in burster.last.error and FakeProfile.made == []


def test_slow_steps_lengthen_the_wait_for_the_start_step(burster: burst.Burster) -> None:
    assert burster.request(wire.BurstRequest(start_step=10, arm_timeout_s=1.0), 100.0, True, "signal")
    burster.on_step(101.0, 1)
    burster.on_step(109.0, 2)  # 8 s steps: three of them is the wait
    timer = burster._timer
    assert timer is not None and timer.interval == pytest.approx(24.0)
    burster._cancel_timer()


@pytest.mark.parametrize(
    ("steps_s", "wait_s"),
    [([], 3.0), ([0.1, 0.2, 0.1], 3.0), ([5.0, 4.0, 6.0, 5.0, 5.0], 7.5), ([30.0, 30.0], 10.0)],
)
def test_a_slow_training_gets_a_burst_on_its_steps_not_a_time_window(
    monkeypatch: pytest.MonkeyPatch, steps_s: list[float], wait_s: float
) -> None:
    """The arm wait is arm_timeout_s (3 s), or 1.5x the median measured step when longer, at most
    max_s (10 s): a step 5 s after the request starts the burst on that step."""
    FakeProfile.made.clear()
    b = burst.Burster(fake_torch(), INST, lambda: False, lambda: None, lambda n: steps_s[-n:], lambda: None)
    monkeypatch.setattr(b, "_finish", lambda now: setattr(b, "state", "summarizing"))
    assert b.request(wire.BurstRequest(), 100.0, True, "signal")
    assert b.arm_wait_s() == pytest.approx(wait_s)
    b.on_interrupt(100.0 + wait_s - 0.5)  # a timer firing early changes nothing
    assert b.state == "armed"
    if wait_s > 3.0:
        b.on_step(100.0 + wait_s - 0.5, None)
        assert b.state == "running" and b.mode == "steps"
    else:
        b.on_interrupt(100.0 + wait_s)
        assert b.state == "running" and b.mode == "window"
    b._cancel_timer()
