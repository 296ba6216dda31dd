"""FLOPs per step counted in the burst's warmup step (issue 33): within 10 % of the analytic count for
an MLP, a conv net and a transformer block; the CPU's measured peak (tests/unit/test_peaks.py: the
dense peak table, FLOP/s and MFU without torch)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from torchwatch import wire
from torchwatch.hook import burst, flops
from torchwatch.model import peaks

torch = pytest.importorskip("torch")
nn = torch.nn


def _mlp() -> tuple[Any, Any, float]:
    b, dims = 64, [(256, 512), (512, 512), (512, 10)]
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    fwd = sum(2 * b * i * o for i, o in dims)
    # backward: the weights' gradients (as much as forward) and the inputs' gradients of every
    # layer but the first (its input needs none)
    return model, torch.randn(b, 256), 2 * fwd + sum(2 * b * i * o for i, o in dims[1:])


def _conv() -> tuple[Any, Any, float]:
    n, hw = 16, 32 * 32
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip
    c1, c2, lin = 2 * n * hw * 16 * 3 * 9, 2 * n * hw * 32 * 16 * 9, 2 * n * 32 * 10
    return model, torch.randn(n, 3, 32, 32), 3 * (c1 + c2 + lin) - c1


def _block() -> tuple[Any, Any, float]:
    d, heads, t, n = 128, 4, 64, 8
    model = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, batch_first=True, dropout=0.0)
    linear = 2 * n * t * (d * 3 * d + d * d + d * 4 * d + 4 * d * d)  # qkv, out, two feed-forward
    attention = 2 * n * t * t * d * 2  # Q·Kᵀ and A·V
    return model, torch.randn(n, t, d), 3 * (linear + attention) - 2 * n * t * d * 3 * d


@pytest.mark.parametrize("make", [_mlp, _conv, _block], ids=["mlp", "conv", "transformer-block"])
def test_flops_of_a_training_step_are_within_10_percent_of_the_analytic_count(make: Any) -> None:
    torch.manual_seed(0)
    model, x, analytic = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step, note = flops.FlopStep.start(torch)
    assert step is not None and note is None
    model(x).sum().backward()
    opt.step()
    out = step.stop(1e9)
    assert out["flops_per_step"] == pytest.approx(analytic, rel=0.10)
    assert (out["flops_dtype"], out["flops_device"]) == ("float32", "cpu")
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    assert _get_current_dispatch_mode() is None  # the mode is gone


def test_higher_order_operators_run_as_they_are_under_the_count() -> None:
    def branch(x: Any) -> Any:
        return torch.cond(x.sum() > 0, lambda t: t @ t, lambda t: t * 2, (x,))

    x = torch.eye(4)
    step, _ = flops.FlopStep.start(torch)
    assert step is not None
    out = branch(x)  # without supports_higher_order_operators: NotImplementedError in the training
    counted = step.stop(1.0)
    assert torch.equal(out, x @ x) and counted["flops_per_step"] == 0.0  # a HOP's inside is not counted


def test_a_mode_of_the_trainings_on_top_is_never_popped() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

    class Theirs(TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    step, _ = flops.FlopStep.start(torch)
    assert step is not None
    theirs = Theirs()
    theirs.__enter__()
    assert "dispatch mode of its own" in step.stop(1.0)["flops_note"] and step.on
    assert _get_current_dispatch_mode() is theirs
    theirs.__exit__(None, None, None)
    out = step.stop(2.0)  # next boundary: ours is on top again and leaves; the count stays void
    assert not step.on and "flops_per_step" not in out and "dispatch mode" in out["flops_note"]


def _stack() -> list[str]:
    """The dispatch modes on the stack now, innermost last, by class name."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return [type(m).__name__ for m in _get_current_dispatch_mode_stack()]


def test_a_mode_popped_by_someone_else_is_never_replaced_by_popping_another() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode

    class Theirs(TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    step, _ = flops.FlopStep.start(torch)
    assert step is not None
    _pop_mode()  # the training's code pops the innermost mode, ours
    with Theirs():
        out = step.stop(1.0)
        assert _stack() == ["Theirs"]  # theirs is still there
    assert not step.on and "popped" in out["flops_note"] and _stack() == []


def test_no_count_starts_inside_a_mode_of_the_trainings() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):
        step, note = flops.FlopStep.start(torch)
        assert step is None and note is not None
        assert "dispatch mode of its own on the stack" in note and "_FlopCounterMode" in note
        assert _stack() == ["_FlopCounterMode"]
    assert _stack() == []


class _Profile:
    def __init__(self, **kw: Any) -> None:
        self.step_num = 0

    def start(self) -> None: ...
    def step(self) -> None: ...
    def stop(self) -> None: ...


def _burster(monkeypatch: pytest.MonkeyPatch) -> burst.Burster:
    fake = SimpleNamespace(
        profiler=SimpleNamespace(profile=_Profile, schedule=lambda **kw: lambda n: None,
                                 ProfilerActivity=SimpleNamespace(CPU="cpu", CUDA="cuda")),
        autograd=SimpleNamespace(_profiler_enabled=lambda: False),
        cuda=SimpleNamespace(is_initialized=lambda: False),
        ops=torch.ops, get_num_threads=torch.get_num_threads, randn=torch.randn, empty=torch.empty, mm=torch.mm,
        no_grad=torch.no_grad, float32=torch.float32, bfloat16=torch.bfloat16, float16=torch.float16,
        float64=torch.float64,
    )  # fmt: skip
    b = burst.Burster(fake, wire.Instance(123, 4567, 1), lambda: False, lambda: None, lambda n: [], lambda: None)
    monkeypatch.setattr(b, "_finish", lambda now: setattr(b, "state", "summarizing"))
    return b


def test_the_burst_counts_its_warmup_step_and_measures_the_cpu_peak_once(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, analytic = _mlp()
    b = _burster(monkeypatch)
    assert b.request(wire.BurstRequest(), 100.0, True, "signal")
    b.on_step(100.0, 5)  # the profiler starts: its warmup step is counted
    assert b._flop is not None
    model(x).sum().backward()
    b.on_step(100.2, 6)
    b._cancel_timer()
    out = b._flop_out
    assert b._flop is None and out["flops_per_step"] == pytest.approx(analytic, rel=0.10)
    assert out["flop_step_ms"] == pytest.approx(200.0) and out["cpu_peak_flops"] > 1e8 and out["cpu_peak_ms"] > 0
    decoded = wire.BurstResult.decode({"id": 1, **out}, "burst")
    assert decoded.flops_per_step == out["flops_per_step"] and decoded.to_json()["cpu_peak_flops"] > 0


def test_flops_off_by_environment_or_without_a_warmup_step(monkeypatch: pytest.MonkeyPatch) -> None:
    b = _burster(monkeypatch)
    monkeypatch.setenv(flops.ENV, "0")
    assert b.request(wire.BurstRequest(), 100.0, True, "signal")
    b.on_step(100.0, 5)
    b._cancel_timer()
    assert b._flop is None and b._flop_out == {"flops_note": "FLOPs not counted: TORCHWATCH_FLOPS=0"}
    monkeypatch.delenv(flops.ENV)
    b = _burster(monkeypatch)
    assert b.request(wire.BurstRequest(warmup=0), 100.0, True, "signal")
    b.on_step(100.0, 5)
    b._cancel_timer()
    assert b._flop is None and "no warmup step" in b._flop_out["flops_note"]


def test_a_cpu_rate_is_against_its_measured_peak_and_says_so() -> None:
    measured = flops.cpu_peak(torch, "float32")
    assert measured is not None and measured[0] > 1e8
    assert flops.cpu_peak(torch, "float32") == measured  # once per process
    last = wire.BurstResult(1, flops_per_step=1e9, flops_dtype="float32", flops_device="cpu",
                            device_name="AMD EPYC", cpu_peak_flops=measured[0])  # fmt: skip
    rate = peaks.flop_rate(last, 20.0)
    assert rate is not None and rate.measured_peak and rate.mfu == pytest.approx(50e9 / measured[0])
    assert rate.peak_text.startswith("measured float32 matmul peak of this CPU")
    unmeasured = peaks.flop_rate(wire.BurstResult(1, flops_per_step=1e9, flops_device="cpu"), 20.0)
    assert unmeasured is not None and unmeasured.mfu is None and unmeasured.why


def _flop_counted_steps(
    b: burst.Burster, n: int, bursts_at: tuple[int, ...], outside: tuple[int, ...] = ()
) -> tuple[list[list[str]], list[int]]:
    """``n`` steps of an MLP, each (``optimizer.step()`` included) inside the training's own
    ``FlopCounterMode`` as a user measuring MFU writes it; the hook's step boundary (the optimizer
    step's post hook) is inside that block, except for the steps in ``outside``. A burst is asked
    for at the steps in ``bursts_at``. Returns the dispatch-mode stack after each step's block
    and the training's own FLOP count of each step."""
    from torch.utils.flop_counter import FlopCounterMode

    model, x, _ = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stacks, counts = [], []
    for i in range(n):
        t = 100.0 + i
        if i in bursts_at:
            b.state, b._ended_at = "idle", None  # the summary (replaced here) is done
            assert b.request(wire.BurstRequest(), t, True, "signal"), b.last_refusal
        counter = FlopCounterMode(display=False)
        with counter:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            if i not in outside:
                b.on_step(t, i)
        if i in outside:
            b.on_step(t, i)
        b._cancel_timer()
        stacks.append(_stack())
        counts.append(counter.get_total_flops())
    return stacks, counts


def test_bursts_leave_the_dispatch_stack_of_a_training_that_counts_its_own_flops_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # issue 49: the hook pushed its counting mode inside the training's FlopCounterMode, whose
    # __exit__ popped torchwatch's and left its own _FlopCounterMode on the stack for good
    b = _burster(monkeypatch)
    stacks, counts = _flop_counted_steps(b, 12, bursts_at=(1, 6))
    assert stacks == [[]] * 12, stacks
    assert len(set(counts)) == 1  # the training's own count is the same on every step, bursts or not
    assert b._flop is None and "dispatch mode of its own on the stack" in b._flop_out["flops_note"]


def test_a_count_the_training_wraps_later_waits_beneath_and_leaves_when_innermost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the count starts at a boundary outside the training's block (step 1), the next boundaries
    # are inside it: ours waits beneath theirs, never popping theirs, and leaves at step 9's
    # boundary, outside the block again
    b = _burster(monkeypatch)
    stacks, counts = _flop_counted_steps(b, 11, bursts_at=(1,), outside=(1, 9, 10))
    assert stacks[1] == ["_Counting"] and all(s == ["_Counting"] for s in stacks[2:9]), stacks
    assert stacks[9:] == [[], []]
    assert len(set(counts[2:])) == 1  # theirs counted every step alike, ours beneath it or not
    assert b._flop is None
