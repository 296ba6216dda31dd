"""The live install (``torchwatch.hook.live``): in a running training, then taken out again, and
what ``attach`` says about an injection (``torchwatch.cli.injecting``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from torchwatch.cli import injecting
from torchwatch.hook import live
from torchwatch.inject.checks import Finding, Plan
from torchwatch.inject.injector import Outcome

SCRIPT = Path(__file__).with_name("_live_script.py")
REPO = Path(__file__).resolve().parents[2]


def _run(mode: str, tmp_path: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), mode, str(tmp_path / "hooks")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, "TORCHWATCH_TRACE_DIR": str(tmp_path / "traces")},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_install_in_a_running_training_then_detach_restores_everything(tmp_path: Path) -> None:
    out = _run("cycle", tmp_path)
    assert out["prepare"]["prepared"] and out["prepare"]["torch"]
    first = out["install"]
    assert first["installed"] and first["active"] and not first["lazy"] and first["signal_owned"], first
    assert first["dataloaders_found"] == 1  # the loader and its iterator, in the script's globals
    assert out["again"]["already"] and "already installed by torchwatch attach" in out["again"]["reason"]
    # the settings are published at install, before any batch
    (loader,) = out["state_after_install"]["dataloaders"]
    assert (loader["batch_size"], loader["drop_last"], loader["dataset"], loader["batches"]) == (
        16,
        True,
        "TensorDataset",
        0,
    )
    # the iterator made before the install counts its batches, the optimizer built before counts steps
    (loader,) = out["state"]["dataloaders"]
    assert loader["batches"] == 5
    assert out["files"] == ["counters", "hook.json"]
    gone = out["detach"]
    assert gone["detached"] and gone["gone"] and gone["left"] == [], gone
    assert out["unpatched"] and out["sigusr2_default"] and out["hook_gone"]
    assert out["dir_gone"]  # the base directory the install created, too
    assert not out["detach_again"]["detached"] and "no torchwatch hook" in out["detach_again"]["reason"]
    # a second install starts afresh: the iterator's stale record from the first hook is replaced
    assert out["reinstall"]["installed"] and not out["reinstall"]["already"]
    (loader,) = out["reinstall_state"]["dataloaders"]
    assert loader["batches"] == 1
    assert out["detach_last"]["detached"] and out["unpatched_last"]


def test_detach_during_a_burst_stops_the_profiler(tmp_path: Path) -> None:
    out = _run("burst", tmp_path)
    assert out["burst_state"] == "running", out
    # the profiler stops on the held main thread (0.25-0.5 s here); the summary is not waited for
    assert out["detach"]["detached"] and out["detach_s"] < 2.0, out
    assert not out["profiler_on"] and out["unpatched"]


def test_an_install_that_cannot_publish_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    out = _run("unusable", tmp_path)
    first = out["install"]
    assert not first["installed"] and "could not start" in first["reason"] and "TORCHWATCH_DIR" in first["reason"]
    assert out["unpatched"] and out["sigusr2_default"] and out["hook_gone"]


def test_detach_leaves_what_the_training_changed_since(tmp_path: Path) -> None:
    out = _run("wrapped", tmp_path)
    left = out["detach"]["left"]
    assert out["detach"]["detached"]
    assert any("SIGUSR2" in x and "replaced" in x for x in left), left
    assert any("__next__" in x and "someone else" in x for x in left), left
    assert out["next_is_theirs"] and out["get_restored"] and out["sigusr2_kept"]


def test_a_hook_installed_at_start_is_neither_reinstalled_nor_detached(tmp_path: Path) -> None:
    out = _run("at-start", tmp_path)
    assert out["install"]["already"] and "at start" in out["install"]["reason"]
    assert not out["detach"]["detached"] and "installed at start" in out["detach"]["reason"]


class _Iter:
    """Stands in for a ``_BaseDataLoaderIter`` (the attributes torch's sets from the loader)."""

    def __init__(self) -> None:
        self._dataset = object()
        self._auto_collation = True
        self._index_sampler = types.SimpleNamespace(batch_size=64)
        self._num_workers = 4
        self._pin_memory = False
        self._prefetch_factor = 2
        self._persistent_workers = True
        self._drop_last = True
        self._collate_fn = len


def test_settings_from_an_iterator() -> None:
    view = live.settings_view(_Iter())
    assert (view.batch_size, view.num_workers, view.prefetch_factor, view.persistent_workers, view.drop_last) == (
        64,
        4,
        2,
        True,
        True,
    )
    it = _Iter()
    it._auto_collation = False  # batch_size=None: the dataset yields whole batches
    assert live.settings_view(it).batch_size is None


def test_frame_objects_reads_module_frames_and_function_frames_only_from_3_13() -> None:
    marker = object()

    def inner() -> list[Any]:
        local_marker = marker  # noqa: F841 - looked for through the frame
        return list(live.frame_objects(sys._getframe(), 1))

    found = inner()
    assert (marker in found) == live.LOCALS_READABLE
    module_frame = types.SimpleNamespace(
        f_code=types.SimpleNamespace(co_flags=0), f_locals={"a": marker, "b": types.SimpleNamespace(c=1)}, f_back=None
    )
    assert list(live.frame_objects(module_frame, 5)) == [marker, module_frame.f_locals["b"], 1]  # type: ignore[arg-type]


class _FakeInjector:
    def __init__(self, *outcomes: Outcome) -> None:
        self.outcomes = list(outcomes)
        self.asked: list[tuple[str, bool]] = []

    def inject(self, pid: int, what: Any, into_hooked: bool = False, **_limits: float) -> Outcome:
        self.asked.append((what.function, into_hooked))
        return self.outcomes.pop(0)


def _injected(fake: _FakeInjector, capsys: pytest.CaptureFixture[str]) -> tuple[injecting.Injected, list[str]]:
    found = injecting.inject_hook(fake, 42)  # type: ignore[arg-type]
    return found, [ln for ln in capsys.readouterr().err.splitlines() if ln]


def test_attach_says_in_one_line_what_the_injection_did(capsys: pytest.CaptureFixture[str]) -> None:
    ok = Outcome(True, "", "ptrace", {"prepared": True})
    installed = Outcome(True, "", "ptrace", {"installed": True, "signal_owned": True}, wall_s=0.03, held_s=0.012)
    found, lines = _injected(_FakeInjector(ok, installed), capsys)
    assert found.ours and found.hooked and found.pause_ms == pytest.approx(12.0)
    assert len(lines) == 1 and "hook injected into PID 42" in lines[0] and "held 12 ms" in lines[0]

    refused = Outcome(False, "cannot inject into PID 42: ptrace_scope is 3 (reboot)", plan=Plan(None, ()))
    found, lines = _injected(_FakeInjector(refused), capsys)
    assert not found.hooked and not found.ours
    assert len(lines) == 1 and "from outside only" in lines[0] and "ptrace_scope is 3" in lines[0]

    hooked = Plan(None, (Finding("fail", "hook", "PID 42 already has a torchwatch hook: TORCHWATCH_HOOK=1"),))
    found, lines = _injected(_FakeInjector(Outcome(False, "refused", plan=hooked)), capsys)
    assert found.hooked and not found.ours  # read as it is, never taken out
    assert len(lines) == 1 and "nothing injected" in lines[0]


def test_detach_injects_past_the_hook_check_and_reports_what_was_left() -> None:
    fake = _FakeInjector(Outcome(True, "", "ptrace", {"detached": True, "left": ["SIGUSR2: replaced"]}, held_s=0.005))
    done, line, hint = injecting.detach_hook(fake, 42)  # type: ignore[arg-type]
    assert fake.asked == [("detach", True)]
    assert done and "held 5 ms" in line and "SIGUSR2: replaced" in line and hint is None
    nothing = {"detached": False, "reason": "no torchwatch hook in this process"}
    fake = _FakeInjector(Outcome(True, "", "ptrace", nothing))
    done, line, hint = injecting.detach_hook(fake, 42)  # type: ignore[arg-type]
    assert not done and "no torchwatch hook" in line and hint is not None


@pytest.mark.parametrize(
    "answer",
    [{"detached": True, "left": 5}, {"detached": "yes"}, {"detached": True, "left": [1]}, ["detached"], 7],
)
def test_an_answer_that_is_not_the_hooks_is_a_one_line_refusal(answer: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # issue 49: a planted torchwatch/hook/live.py answering "left": 5 ended root's attach in an internal error
    fake = _FakeInjector(Outcome(True, "", "ptrace", answer))
    done, line, hint = injecting.detach_hook(fake, 42)  # type: ignore[arg-type]
    assert not done and line.startswith("refused: PID 42 answered") and "\n" not in line and hint
    ok = Outcome(True, "", "ptrace", {"prepared": True})
    found, lines = _injected(_FakeInjector(ok, Outcome(True, "", "ptrace", answer)), capsys)
    assert not found.hooked and not found.ours  # nothing of it trusted: watched from outside only
    assert len(lines) == 1 and "refused: PID 42 answered" in lines[0]


def test_an_answers_texts_are_cut_to_one_short_line() -> None:
    answer = {"detached": True, "left": ["x\n" * 10_000] * 1000, "reason": "y" * 100_000}
    fake = _FakeInjector(Outcome(True, "", "ptrace", answer))
    done, line, _ = injecting.detach_hook(fake, 42)  # type: ignore[arg-type]
    assert done and "\n" not in line and len(line) < 64 * 600


def test_an_install_mid_epoch_counts_the_next_epochs_on_one_record_of_the_dataloader(tmp_path: Path) -> None:
    """The iterator made before the install gets a stand-in record (its DataLoader is a function's
    local); the DataLoader's next iterator takes the stand-in's batches over, so the loader is one
    record with the epochs, not two that take turns at being the busiest (under attach, the epoch
    was unknown until the new record's batches passed the stand-in's)."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("_live_epochs_script.py")), str(tmp_path / "tw")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["install"]["installed"], out
    assert out["records"] == [27 + 32 + 32], out  # batches 6..32 of the first epoch (5 came before), two whole ones
    p = out["progress"]
    assert (p["epoch"], p["batch"], p["epoch_len"]) == (2, 32, 32), p  # the epoch running at the install is not counted
