"""``torchwatch attach`` injecting the hook into a training started with plain Python, ``torchwatch
detach``, and the live install (``torchwatch.hook.live``) on every interpreter found."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DEMO, REPO, torchwatch
from tests.integration.injection import HOLDER, INJECT_TIMEOUT_S, _interpreter, running
from torchwatch.cli.injecting import DETACH, INSTALL, PREPARE
from torchwatch.inject.injector import DETACH_TIMEOUT_S, DETACH_WINDOW_S, Injector
from torchwatch.sources.hook import HookReader, hook_dir

pytestmark = pytest.mark.integration

STEP = re.compile(r"step (\d+),")

DETACH_LIMITS = {"window_s": DETACH_WINDOW_S, "timeout_s": max(DETACH_TIMEOUT_S, INJECT_TIMEOUT_S)}  # attach's window


GLIBC_INTERNAL = (1 << (32 - 1)) | (1 << (33 - 1))
"""Signals 32 and 33 (SIGCANCEL, SIGSETXID), below ``signal.SIGRTMIN`` (34): glibc's own. It
installs their handlers when a process creates its first thread (nptl's ``late_init``), so a
training that had no thread before the hook (a DataLoader demo with one OpenMP thread) catches them
after: glibc's, never the user's, and not something a detach can or should put back."""


def sigcgt(pid: int) -> str:
    """The caught-signals mask of ``pid`` (``/proc/PID/status``), glibc's own signals left out
    (:data:`GLIBC_INTERNAL`), as 16 hex digits."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return f"{int(line.split()[1], 16) & ~GLIBC_INTERNAL:016x}"
    raise AssertionError("no SigCgt")


class Demo:
    """A demo training started with plain Python; its progress lines are read in the background."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        self.steps: list[tuple[float, int]] = []
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            m = STEP.search(line)
            if m:
                self.steps.append((time.monotonic(), int(m.group(1))))

    def step_after(self, t: float, timeout: float) -> int | None:
        """The first step count printed after monotonic time ``t``, waiting up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            later = [n for at, n in self.steps if at > t]
            if later:
                return later[0]
            if self.proc.poll() is not None:
                return None
            time.sleep(0.2)
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture
def dataloader_demo() -> Iterator[Demo]:
    demo = Demo(str(DEMO / "dataloader_bound.py"), "--seconds", "240", "--device", "cpu")
    try:
        assert demo.step_after(0.0, 90) is not None, "the demo never printed a step:\n" + "".join(demo.lines)
        yield demo
    finally:
        demo.stop()


HOOKED_WITHIN_S = 90.0
"""How long the burst waits for the injected hook to publish: attach's injection and the hook's
import of torch's profiler on a loaded machine (it once waited a fixed 8 s); the 90 s the demo
fixture gives torch's import, measured at 20-40 s beside a spinning process on 2 cores."""


def _burst_when_hooked(pid: int, out: list[subprocess.CompletedProcess[str]]) -> None:
    """Wait for the injected hook to publish, then ``torchwatch burst PID`` (one step)."""
    deadline = time.monotonic() + HOOKED_WITHIN_S
    while time.monotonic() < deadline:
        d = hook_dir(pid)
        if d is not None and (d / "hook.json").exists():
            break
        time.sleep(0.1)
    out.append(
        subprocess.run(
            [sys.executable, "-m", "torchwatch", "burst", "--steps", "1", "--wait", "60", str(pid)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
    )


class Attach:
    """``torchwatch attach --headless --json OUT PID`` running until the test stops it with SIGINT
    (:meth:`stop`), its stderr (the status lines, the injection's lines) read as it comes."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchwatch", "attach", "--headless", "--json", str(out), str(pid)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def status_lines(self) -> int:
        """Status lines printed so far (one per analysis that printed)."""
        return sum(1 for line in list(self.lines) if re.match(STATUS_LINE, line))

    def read_after(self, pid: int, timeout: float) -> bool:
        """Whether, within ``timeout`` s, the injected hook published an optimizer step and the
        training's DataLoader, and two status lines came after that (torchwatch read the hook again
        since: its report then holds both). A fixed watch of 10 s ended before the DataLoader was
        published on a loaded machine."""
        deadline = time.monotonic() + timeout
        seen: int | None = None
        while time.monotonic() < deadline and self.proc.poll() is None:
            if seen is None:
                reader = HookReader(pid)
                rec = reader.record()
                counters = reader.counters() if rec is not None else None
                if rec is not None and rec.dataloaders and counters is not None and counters.steps >= 1:
                    seen = self.status_lines()
            elif self.status_lines() >= seen + 2:
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> tuple[int, str, dict[str, Any] | None]:
        """SIGINT (attach takes the hook out and writes the report), then its status, stderr and report."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        report = json.loads(self.out.read_text()) if self.out.exists() else None
        return self.proc.returncode, "".join(self.lines), report


STATUS_LINE = r"torchwatch \[\s*\d+s\] "
"""The start of a status line (``--headless``)."""


def test_attach_injects_into_a_plain_training_and_detaching_restores_it(dataloader_demo: Demo, tmp_path: Path) -> None:
    pid = dataloader_demo.proc.pid
    before = sigcgt(pid)
    bursts: list[subprocess.CompletedProcess[str]] = []
    burster = threading.Thread(target=_burst_when_hooked, args=(pid, bursts))
    burster.start()
    out = tmp_path / "attach.json"
    # attach watches until the burst has ended, then is stopped (Ctrl-C): a fixed --duration ended
    # it, and took the hook out, before a burst on a loaded machine had ended ("PID exited before
    # the burst ended")
    attach = Attach(pid, out)
    try:
        burster.join(HOOKED_WITHIN_S + 150)
        assert not burster.is_alive(), "torchwatch burst did not end"
        read = attach.read_after(pid, HOOKED_WITHIN_S)  # and torchwatch has read the hook's steps
    finally:
        code, stderr, report = attach.stop()
    assert read, stderr
    ended = time.monotonic()
    assert bursts and bursts[0].returncode == 0, bursts and bursts[0].stderr
    assert code == -signal.SIGINT, stderr  # ended by the Ctrl-C (a shell: 130), after the report
    assert f"hook injected into PID {pid}" in stderr, stderr
    assert re.search(r"the training was held \d+ ms", stderr), stderr
    assert f"hook taken out of PID {pid}" in stderr, stderr
    assert report is not None and report["ended_by"] == "SIGINT", stderr
    injection = report["injection"]
    assert injection["injected"] and injection["method"] == "ptrace" and injection["pause_ms"] > 0, injection
    hook = report["hook"]
    assert hook["status"] == "ok", hook
    assert hook["steps"] >= 1, (hook, stderr[-3000:])
    assert hook["data_wait_fraction"] is not None and hook["data_wait_fraction"] > 0.2  # a dataloader-bound demo
    loader = hook["dataloader"]
    # the demo's own settings (demo/dataloader_bound.py), found for an iterator made before the injection
    assert (loader["batch_size"], loader["num_workers"], loader["drop_last"], loader["dataset"]) == (
        32,
        0,
        True,
        "SlowImages",
    ), loader
    assert hook["last_burst"] is not None, hook
    # after detach: the training runs on, SIGUSR2 is as it was, the hook's files are gone
    assert dataloader_demo.step_after(ended, 60) is not None, "no step after detach:\n" + "".join(
        dataloader_demo.lines[-20:]
    )
    assert sigcgt(pid) == before
    d = hook_dir(pid)
    assert d is not None and not d.exists()
    # attach again: injected again, read again, taken out again
    out2 = tmp_path / "again.json"
    # (until it has read the hook: a fixed 6 s watch ended before that on a loaded machine)
    again = Attach(pid, out2)
    try:
        read = again.read_after(pid, HOOKED_WITHIN_S)
    finally:
        code, stderr, report = again.stop()
    assert read, stderr
    assert code == -signal.SIGINT, stderr
    assert f"hook injected into PID {pid}" in stderr and f"hook taken out of PID {pid}" in stderr
    assert report is not None and report["hook"]["status"] == "ok", report and report["hook"]
    assert sigcgt(pid) == before
    assert dataloader_demo.proc.poll() is None
    # nothing left to detach: one line, exit 1
    nothing = torchwatch("detach", str(pid))
    assert nothing.code == 1 and "no torchwatch hook in this process" in nothing.stderr, nothing.stderr
    assert "Traceback" not in "".join(dataloader_demo.lines)


def test_no_inject_and_a_refused_injection_watch_from_outside(dataloader_demo: Demo, tmp_path: Path) -> None:
    pid = dataloader_demo.proc.pid
    plain = torchwatch("attach", "--headless", "--duration", "3", "--no-inject", str(pid))
    assert plain.code == 0 and "inject" not in plain.stderr and "outside only" not in plain.stderr, plain.stderr
    # a process someone else traces cannot be injected into: one line with why, and the watch goes on
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(pid)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "seized"
        out = tmp_path / "refused.json"
        refused = torchwatch("attach", "--headless", "--duration", "3", "--json", str(out), str(pid), json_path=out)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    lines = [ln for ln in refused.stderr.splitlines() if "outside only" in ln]
    assert refused.code == 0 and len(lines) == 1, refused.stderr
    assert f"already traced by PID {holder.pid}" in lines[0], lines[0]
    assert "hook taken out" not in refused.stderr  # nothing was injected, nothing to take out
    assert refused.report is not None and refused.report["injection"]["injected"] is False
    assert refused.report["injection"]["reason"] in lines[0]
    assert dataloader_demo.proc.poll() is None


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_live_install_is_lazy_without_torch_on_every_interpreter(version: str, scripts: Path) -> None:
    python = _interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine")
    with running([python, str(scripts / "loop.py"), "60"]) as target, Injector() as injector:
        prepared = injector.inject(target.pid, PREPARE, timeout_s=INJECT_TIMEOUT_S)
        assert prepared.ok and prepared.value["prepared"] and not prepared.value["torch"], prepared
        first = injector.inject(target.pid, INSTALL, timeout_s=INJECT_TIMEOUT_S)
        assert first.ok, first.reason
        value = first.value
        assert value["installed"] and value["lazy"] and value["import_watcher"], value
        assert not value["active"] and value["errors"] == []
        assert first.result["python"].startswith(version + ".")
        again = injector.inject(target.pid, INSTALL, timeout_s=INJECT_TIMEOUT_S)
        assert again.ok and again.value["already"], again.value
        gone = injector.inject(target.pid, DETACH, into_hooked=True, **DETACH_LIMITS)
        assert gone.ok and gone.value["detached"], gone
        # after detach, an install starts from scratch
        fresh = injector.inject(target.pid, INSTALL, timeout_s=INJECT_TIMEOUT_S)
        assert fresh.ok and fresh.value["installed"] and not fresh.value["already"], fresh.value
        assert injector.inject(target.pid, DETACH, into_hooked=True, **DETACH_LIMITS).value["detached"]
        assert target.poll() is None
        target.kill()
        target.wait()
        assert target.stderr is not None and target.stderr.read() == ""  # nothing said in the target


LATE_TORCH = """
import os, sys, time
print("ready", os.getpid(), flush=True)
flag = sys.argv[1]
while not os.path.exists(flag):
    time.sleep(0.01)
import torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
while True:
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.01)
"""


def test_a_lazy_live_install_activates_when_torch_is_imported(tmp_path: Path) -> None:
    script = tmp_path / "late.py"
    script.write_text(LATE_TORCH)
    flag = tmp_path / "go"
    env = dict(os.environ, TORCHWATCH_DIR=str(tmp_path / "hooks"))
    with running([sys.executable, str(script), str(flag)], env=env) as target, Injector() as injector:
        assert injector.inject(target.pid, PREPARE, timeout_s=INJECT_TIMEOUT_S).ok
        installed = injector.inject(target.pid, INSTALL, timeout_s=INJECT_TIMEOUT_S)
        assert installed.ok and installed.value["lazy"], installed
        d = hook_dir(target.pid)
        assert d is not None and not d.exists()  # nothing published before torch
        flag.write_text("")
        deadline = time.monotonic() + 60
        # the counters come at activation, hook.json at the hook's first publication after it
        while time.monotonic() < deadline and not (d / "hook.json").exists():
            time.sleep(0.1)
        assert (d / "counters").exists() and (d / "hook.json").exists(), "the hook did not activate with torch"
        gone = injector.inject(target.pid, DETACH, into_hooked=True, **DETACH_LIMITS)
        assert gone.ok and gone.value["detached"] and gone.value["gone"], gone.value
        assert not d.exists() and not (tmp_path / "hooks").exists()  # the base directory it created too
        assert target.poll() is None


def test_the_injector_helper_outlives_a_ctrl_c_and_ends_with_torchwatch() -> None:
    import signal

    from torchwatch.inject.injector import _Helper

    helper = _Helper()
    assert helper.start() is None and helper.proc is not None
    proc = helper.proc
    try:
        time.sleep(0.5)  # let it reach its loop
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            os.kill(proc.pid, sig)
        time.sleep(0.3)
        assert proc.poll() is None, "a stop signal for torchwatch's group ended the helper"
    finally:
        helper.close()
    assert proc.poll() is not None  # closing its stdin ends it
