"""The loss and epoch the hook reads and publishes (real torch runs, each in a fresh interpreter),
and the ``progress`` section of ``hook.json`` on the wire."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torchwatch import wire
from torchwatch.hook.progress import GRADIENT, NOT_SCALAR, OTHER_DEVICE, SEVERAL, LossWatch, UpdateWatch

SCRIPT = Path(__file__).with_name("_progress_script.py")
REPO = Path(__file__).resolve().parents[2]


def run(mode: str, tmp_path: Path) -> dict[str, Any]:
    pytest.importorskip("torch", reason="the hook's training runs need torch")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), mode, str(tmp_path / "tw")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["installed"]
    return out


def test_the_loss_series_is_the_printed_losses_and_the_epoch_is_the_scripts(tmp_path: Path) -> None:
    r = run("every", tmp_path)
    assert r["errors"] == []
    p = r["progress"]
    assert (p["epoch"], p["batch"], p["epoch_len"]) == (*r["last"], 10) == (3, 3, 10)
    series = {str(step): value for step, _t, value in p["loss"]}
    assert len(series) == 23 and series == r["printed"]  # step numbers and values as the script printed
    assert p["first_nonfinite"][0] == 20 and p["first_nonfinite"][2] == "nan"
    assert p["loss_note"] == ""


def test_the_loss_is_read_at_most_every_quarter_second(tmp_path: Path) -> None:
    p = run("paced", tmp_path)["progress"]
    times = [t for _s, t, _v in p["loss"]]
    assert len(times) >= 2  # 12 steps 0.1 s apart
    assert all(b - a >= wire.LOSS_EVERY_S for a, b in itertools.pairwise(times))
    assert len(times) < 12


def test_with_a_grad_scaler_the_loss_read_is_the_unscaled_one(tmp_path: Path) -> None:
    r = run("scaler", tmp_path)
    assert r["errors"] == [] and r["scale"] >= 1024.0
    series = {str(step): value for step, _t, value in r["progress"]["loss"]}
    assert len(series) == 10 and series == r["printed"]  # loss, not loss x 1024


def test_a_backward_that_is_not_a_loss_gives_no_loss_and_says_why(tmp_path: Path) -> None:
    r = run("not_scalar", tmp_path)
    notes = [n["loss_note"] for n in r["notes"]]
    assert notes == [GRADIENT, SEVERAL, NOT_SCALAR.format(n=4)]
    assert all(n["loss"] == [] for n in r["notes"])
    # torch's own error reached the script, unchanged; the hook recorded no error of its own
    assert r["error"] == "grad can be implicitly created only for scalar outputs"
    assert r["errors"] == []


def test_persistent_workers_count_epochs_and_an_iterable_has_no_length(tmp_path: Path) -> None:
    r = run("persistent", tmp_path)
    p = r["persistent"]["progress"]
    assert (p["epoch"], p["batch"], p["epoch_len"]) == (3, 6, 10)  # 6 batches taken, the 6th breaks
    q = r["iterable"]["progress"]
    assert (q["epoch"], q["batch"], q["epoch_len"]) == (1, 25, None)


def test_progress_round_trips_and_old_records_decode() -> None:
    nan = wire.LossSample(7, 12.5, math.nan)
    info = wire.ProgressInfo(2, 5, 100, (wire.LossSample(6, 12.0, 0.25), nan), nan, "")
    back = wire.ProgressInfo.decode(json.loads(json.dumps(info.to_json())), "p")
    assert back.loss[0] == info.loss[0] and math.isnan(back.loss[1].value) and back.first_nonfinite is not None
    assert (back.epoch, back.batch, back.epoch_len) == (2, 5, 100)
    rec = wire.HookRecord(wire.Instance(10, 1, 2), "3.12", "2.13", 1.0, 12, True)
    data = rec.to_json()
    assert "progress" not in data and wire.HookRecord.decode(data).progress is None  # an older hook's record
    data["progress"] = info.to_json()
    assert wire.HookRecord.decode(data).progress is not None


@pytest.mark.parametrize(
    "bad",
    [
        {"loss": [[1, 2.0, "NaN!"]]},
        {"loss": [[1, 2.0, 1e309]]},
        {"loss": [[-1, 2.0, 1.0]]},
        {"loss": [[1, 2.0, 1.0]] * (wire.LOSS_HISTORY + 1)},
        {"epoch": -1},
        {"loss_note": "x" * 1000},
    ],
)
def test_a_bad_progress_section_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(wire.WireError):
        wire.ProgressInfo.decode(bad, "hook.json.progress")


class _FakeCuda:
    """The few ``torch.cuda`` calls :class:`LossWatch` makes, recorded; anything else (a
    ``synchronize``) is an AttributeError, which the test would see."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.done = False
        outer = self

        class Event:
            def record(self, stream: object) -> None:
                outer.calls.append("record")

            def query(self) -> bool:
                outer.calls.append("query")
                return outer.done

        self.Event = Event

    def current_stream(self, device: object) -> str:
        return "stream"

    @contextlib.contextmanager
    def stream(self, stream: object) -> Iterator[None]:
        yield


class _FakeTorch:
    """``torch`` as LossWatch sees it on a CUDA training (no GPU needed)."""

    def __init__(self) -> None:
        self.cuda = _FakeCuda()
        self.float64 = "float64"
        self.copied: list[tuple[float, bool]] = []
        fake = self

        class Tensor:
            def __init__(self, value: float, cuda: bool) -> None:
                self.value, self.is_cuda, self.is_cpu = value, cuda, not cuda
                self.device: Any = "cuda:0" if cuda else "cpu"

            def numel(self) -> int:
                return 1

            def detach(self) -> Tensor:
                return self

            def item(self) -> float:
                assert self.is_cpu, "item() of a CUDA tensor: a device sync"
                return self.value

            def copy_(self, src: Tensor, non_blocking: bool = False) -> None:
                fake.copied.append((src.value, non_blocking))
                self.value = src.value

        self.Tensor = Tensor

    def empty(self, shape: object, dtype: object, pin_memory: bool) -> Any:
        assert pin_memory
        return self.Tensor(0.0, False)


def test_a_cuda_loss_is_copied_without_blocking_and_read_once_its_event_is_done() -> None:
    torch = _FakeTorch()
    watch = LossWatch()
    watch.read(torch, (torch.Tensor(0.5, True),), {}, 1, 10.0)
    assert torch.copied == [(0.5, True)] and torch.cuda.calls == ["record"] and not watch.samples
    watch.read(torch, (torch.Tensor(0.4, True),), {}, 2, 10.3)  # the copy is not done: no second one
    assert torch.copied == [(0.5, True)] and not watch.samples
    torch.cuda.done = True
    assert not watch.read(torch, (torch.Tensor(math.nan, True),), {}, 3, 10.6)
    assert [(s, v) for s, _t, v in watch.samples] == [(1, 0.5)]  # the step it was taken at
    assert math.isnan(torch.copied[-1][0]) and torch.copied[-1][1]  # the next copy, non-blocking
    assert watch.read(torch, (), {"tensors": torch.Tensor(0.1, True)}, 4, 10.9)  # the NaN, read now
    assert watch.first_nonfinite is not None and watch.first_nonfinite[0] == 3


def test_a_loss_on_another_device_is_not_read_and_says_so() -> None:
    torch = _FakeTorch()
    t = torch.Tensor(0.5, False)
    t.is_cpu = False
    t.device = type("D", (), {"type": "mps"})()
    watch = LossWatch()
    watch.read(torch, (t,), {}, 1, 1.0)
    assert watch.note == OTHER_DEVICE.format(device="mps") and not watch.samples and torch.copied == []


# -- tqdm bars ----------------------------------------------------------------------------------


def test_the_live_tqdm_bars_are_read_outermost_first_and_a_closed_one_is_gone() -> None:
    tqdm = pytest.importorskip("tqdm").tqdm
    from torchwatch.hook.progress import read_bars

    with open("/dev/null", "w") as screen:
        epochs = tqdm(total=5, desc="Epochs", file=screen)
        epochs.update(2)
        batches = tqdm(total=50, desc="batches: ", leave=False, file=screen)
        batches.update(25)
        try:
            got = read_bars(now_wall=epochs.start_t + 30.0)
            assert [(b.desc, b.n, b.total, b.pos) for b in got] == [("Epochs", 2, 5, 0), ("batches", 25, 50, 1)]
            assert got[0].elapsed_s == pytest.approx(30.0, abs=1e-3)
            batches.close()
            assert [b.desc for b in read_bars()] == ["Epochs"]
        finally:
            batches.close()
            epochs.close()
    assert all(b.desc not in ("Epochs", "batches") for b in read_bars())


def test_a_bar_with_attributes_that_are_not_tqdms_is_skipped_and_nothing_of_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only ``__dict__`` entries are read: a property or ``__getattribute__`` of the user's
    subclass never runs, a value that is not a count is skipped, and a description is cleaned."""
    tqdm = pytest.importorskip("tqdm").tqdm
    from torchwatch.hook.progress import read_bars

    ran: list[str] = []

    class Loud(tqdm):  # type: ignore[misc]
        def __getattribute__(self, name: str) -> Any:
            if name in ("n", "total", "desc", "start_t", "pos"):
                ran.append(name)
            return super().__getattribute__(name)

    with open("/dev/null", "w") as screen:
        bars = [Loud(total=10, desc="ok\x1b[2J\n", file=screen), tqdm(total=10, file=screen), tqdm(file=screen)]
        try:
            vars(bars[1])["n"] = "three"  # not a count: skipped
            vars(bars[2])["total"] = math.inf  # no total
            ran.clear()
            got = read_bars()
            assert ran == []
            assert [(b.desc, b.total) for b in got] == [("ok[2J", 10), ("", None)]
        finally:
            vars(bars[1])["n"], vars(bars[2])["total"] = 0, None  # tqdm's own close() reads them
            for b in bars:
                b.close()
    monkeypatch.delitem(sys.modules, "tqdm.std")
    assert read_bars() == ()  # tqdm never imported: nothing to read


def test_bars_round_trip_and_bad_bars_are_refused() -> None:
    bars = (wire.BarInfo(2.0, 5.0, "Epochs", 30.5, 0), wire.BarInfo(25.0, None, "", 1.0, 1))
    info = wire.ProgressInfo(bars=bars)
    assert wire.ProgressInfo.decode(json.loads(json.dumps(info.to_json())), "p").bars == bars
    for bad in (
        {"n": -1, "elapsed_s": 1.0},
        {"n": 1, "total": 1e16, "elapsed_s": 1.0},
        {"n": 1, "desc": "x" * (wire.BAR_DESC + 1), "elapsed_s": 1.0},
        {"n": 1},
    ):
        with pytest.raises(wire.WireError):
            wire.ProgressInfo.decode({"bars": [bad]}, "p")
    with pytest.raises(wire.WireError):
        wire.ProgressInfo.decode({"bars": [bars[0].to_json()] * (wire.BARS_MAX + 1)}, "p")


def _sgd(lr: float = 0.1, grad: bool = True) -> tuple[Any, Any]:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    if grad:
        model(torch.ones(2, 4)).sum().backward()
    return torch, opt


def test_steps_that_update_the_parameters_are_not_still() -> None:
    _torch, opt = _sgd()
    watch = UpdateWatch()
    for k in range(3):
        opt.step()
        watch.sample(opt, k + 1, 10.0 + 2 * k)
    assert watch.info == wire.UpdateInfo(2, 2, 0.1, 0, 0.0, "")


def test_an_optimizer_whose_parameters_have_no_gradient_is_still_from_its_first_record() -> None:
    _torch, opt = _sgd(grad=False)  # built over tensors the loss does not reach (requires_grad=False, ...)
    watch = UpdateWatch()
    for k in range(4):
        opt.step()
        watch.sample(opt, 10 * (k + 1), 10.0 + 2 * k)
    assert watch.info == wire.UpdateInfo(2, 0, 0.1, 30, 6.0, "no-grad")


def test_a_learning_rate_of_zero_is_still_though_the_steps_write_the_parameters() -> None:
    _torch, opt = _sgd(lr=0.0)
    watch = UpdateWatch()
    for k in range(3):
        opt.step()  # writes each parameter in place (alpha -0.0): the version moves
        watch.sample(opt, k + 1, 10.0 + 2 * k)
    assert watch.info is not None and (watch.info.why, watch.info.still_steps) == ("lr-zero", 2)
    opt.param_groups[0]["lr"] = 0.1  # the schedule left 0: no longer still
    opt.step()
    watch.sample(opt, 4, 16.0)
    assert watch.info is not None and (watch.info.why, watch.info.still_steps, watch.info.still_s) == ("", 0, 0.0)


def test_no_parameter_written_is_said_only_of_torchs_own_optimizers() -> None:
    torch, opt = _sgd()
    watch = UpdateWatch()
    watch.sample(opt, 1, 10.0)
    watch.sample(opt, 2, 12.0)  # no step in between: nothing written
    assert watch.info is not None and watch.info.why == "unchanged"

    class ByData(torch.optim.SGD):  # type: ignore[misc,name-defined]
        """A hand-written optimizer that writes p.data: its own version counter, never p's."""

        def step(self, closure: Any = None) -> None:
            for group in self.param_groups:
                for p in group["params"]:
                    p.data.add_(p.grad, alpha=-group["lr"])

    mine = ByData(opt.param_groups[0]["params"], lr=0.1)
    watch = UpdateWatch()
    for k in range(3):
        mine.step()
        watch.sample(mine, k + 1, 10.0 + 2 * k)
    assert watch.info is not None and watch.info.why == ""  # not "unchanged": p.data writes are not counted


def test_a_tensor_learning_rate_is_not_read_and_a_hostile_group_is_skipped() -> None:
    torch, opt = _sgd()
    opt.param_groups[0]["lr"] = torch.tensor(0.0)  # a CUDA one would need a sync to read
    watch = UpdateWatch()
    opt.step()
    assert watch.sample(opt, 1, 10.0)
    assert watch.info is not None and watch.info.lr_max is None and watch.info.why == ""

    odd = types.SimpleNamespace(param_groups=["not a dict"])
    watch = UpdateWatch()
    assert not watch.sample(odd, 1, 10.0) and watch.info is None


def test_update_info_round_trips_and_bad_values_are_refused() -> None:
    info = wire.UpdateInfo(12, 0, 0.001, 40, 21.5, "no-grad")
    p = wire.ProgressInfo(loss=(), updates=info)
    assert wire.ProgressInfo.decode(json.loads(json.dumps(p.to_json())), "p") == p
    for bad in ({"why": "melted"}, {"params": -1}, {"with_grad": "2"}, {"still_s": math.inf}):
        with pytest.raises(wire.WireError):
            wire.UpdateInfo.decode({**info.to_json(), **bad}, "p.updates")
