"""Whatever stops torchwatch, the report is written and nothing of the launched tree is left.

Each test starts a real training under ``torchwatch run --headless --json r.json``, signals
torchwatch a few seconds in, and checks: a complete, schema-valid r.json saying what ended the
watch, the text report on stdout, torchwatch ended by that signal, and no process of the tree
alive. Run with ``-s`` to see the measured seconds.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.integration.conftest import DEMO, REPO, Watched
from torchwatch.watch.lifecycle import INTERRUPT_GRACE_S

pytestmark = pytest.mark.integration

SCHEMA = REPO / "tests" / "unit" / "report_schema.json"
IGNORES_SIGINT = (
    "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ready', flush=True)\n"
    "end = time.monotonic() + 300\nwhile time.monotonic() < end: sum(range(10_000))\n"
)


COUNTS_SIGINT = (
    "import signal, sys, time\n"
    "got = []\n"
    "signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))\n"
    "print('ready', flush=True)\n"
    "while not got: time.sleep(0.05)\n"
    "time.sleep(2)  # a second SIGINT, if one comes, arrives meanwhile\n"
    "open(sys.argv[1], 'w').write(str(len(got)))\n"
)


def _default_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class Watching:
    """``python -m torchwatch run --headless --json OUT ARGS -- COMMAND`` in its own session
    (no terminal, as under CI), its stderr read in the background."""

    def __init__(self, out: Path, command: list[str], *args: str) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchwatch", "run", "--headless", "--json", str(out), *args, "--", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            start_new_session=True,
            # torchwatch keeps an ignored SIGHUP ignored (as under nohup); a test run under nohup
            # must not hand that on to the watch whose SIGHUP handling it checks
            preexec_fn=_default_sighup,
        )
        self.stderr: list[str] = []
        self.stdout = ""
        assert self.proc.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True)
        self._reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.stderr.append(line)

    def wait_for_label(self, timeout: float = 120.0) -> None:
        """Until a status line names a label with some confidence and the training has printed a
        step (its loop runs: a label came while a loaded machine's training was still importing
        torch, and the stop then interrupted the import). ``timeout``: torch's import and the
        first steps beside a spinning process on 2 cores, x 3."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = list(self.stderr)
            if any("bound (" in ln for ln in lines) and any(re.search(r"\bstep \d+,", ln) for ln in lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError("no labelled status line:\n" + "".join(self.stderr[-20:]))

    def tree(self) -> list[psutil.Process]:
        """torchwatch's descendants now: the guard, the training and its children, py-spy."""
        return psutil.Process(self.proc.pid).children(recursive=True)

    def finish(self, timeout: float = 60.0) -> float:
        """Wait for torchwatch to end; the seconds it took."""
        start = time.monotonic()
        self.stdout, _ = self.proc.communicate(timeout=timeout)
        self._reader.join(5)
        return time.monotonic() - start

    def report(self) -> dict[str, Any]:
        """The JSON report, checked against the report schema."""
        import jsonschema

        assert self.out.exists(), "no JSON report:\n" + "".join(self.stderr[-20:])
        data: dict[str, Any] = json.loads(self.out.read_text())
        jsonschema.validate(data, json.loads(SCHEMA.read_text()))
        return data

    def stop_with(self, signals: list[int], group: bool = False) -> tuple[float, bool]:
        """Send ``signals`` 0.2 s apart (to the whole process group with ``group``, as a terminal's
        Ctrl-C does); the seconds until torchwatch ended, and whether its tree was gone 5 s later."""
        tree = self.tree()
        assert len(tree) >= 2, tree  # the guard and the training at least
        start = time.monotonic()
        for sig in signals:
            (os.killpg if group else os.kill)(self.proc.pid, sig)
            time.sleep(0.2)
        self.finish()
        took = time.monotonic() - start
        gone = gone_within(tree, 5.0) is not None
        print(f"\n{'+'.join(signal.Signals(s).name for s in signals)}: torchwatch ended after {took:.2f} s; ", end="")
        print(f"{len(tree)} processes gone: {gone}", end="")
        return took, gone

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


def gone_within(procs: list[psutil.Process], seconds: float) -> float | None:
    """Seconds until every process of ``procs`` has ended, or ``None`` past ``seconds``."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if not alive(procs):
            return time.monotonic() - start
        time.sleep(0.02)
    return None


SLEEP_2S = [sys.executable, "-c", "import time; time.sleep(2)"]
CPU_BOUND = [sys.executable, str(DEMO / "cpu_bound.py"), "--seconds", "300", "--device", "cpu"]


@pytest.mark.parametrize(
    "signals",
    [[signal.SIGTERM], [signal.SIGHUP], [signal.SIGINT, signal.SIGINT]],
    ids=["SIGTERM", "SIGHUP", "2xSIGINT"],
)
def test_a_stop_signal_leaves_the_report_and_no_process(tmp_path: Path, signals: list[int]) -> None:
    w = Watching(tmp_path / "r.json", CPU_BOUND)
    try:
        w.wait_for_label()
        took, gone = w.stop_with(signals)
    finally:
        w.kill()
    assert gone
    # no SIGINT grace waited for a signal the training never got: a deadline from the wrong
    # behaviour (it takes the grace and more), not a speed target
    assert took < INTERRUPT_GRACE_S, took
    assert w.proc.returncode == -signals[0], "".join(w.stderr[-20:])  # ended by the signal it got
    data = w.report()
    assert data["ended_by"] == signal.Signals(signals[0]).name
    assert data["target"]["exit_code"] is not None
    # the report holds the watch: the label its status line showed (the final one may already be
    # the loop winding down; which label depends on the load this test runs beside)
    shown = {m.group(1) for ln in w.stderr if (m := re.search(r"\] (\S+-bound) \(", ln))}
    assert shown & {h["label"] for h in data["verdict_history"]}, (shown, data["verdict_history"])
    assert f"verdict: {data['verdict']['label']}" in w.stdout and "Traceback" not in "".join(w.stderr)


def test_sigkill_leaves_no_training_and_no_dataloader_worker(tmp_path: Path) -> None:
    command = [sys.executable, str(DEMO / "dataloader_bound.py"), "--seconds", "300", "--device", "cpu"]
    w = Watching(tmp_path / "r.json", [*command, "--num-workers", "2"])
    try:
        w.wait_for_label()
        # the training and its two workers: a label can come before the DataLoader starts its
        # workers (the demo builds its dataset first; seen in a loaded run: the tree then had the
        # guard, the training and an exited py-spy)
        deadline = time.monotonic() + 60.0
        while True:
            tree = w.tree()
            workers = [p for p in tree if _cmdline(p)[:2] == command[:2] and _ppid(p) != w.proc.pid]
            if len(workers) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        os.kill(w.proc.pid, signal.SIGKILL)
        gone = gone_within(tree, 10.0)
    finally:
        w.kill()
    print(f"\nSIGKILL: {len(tree)} processes ({len(workers)} besides the guard) gone after {gone} s")
    assert len(workers) >= 3, [_cmdline(p) for p in tree]  # the training and its two workers
    assert gone is not None and gone < 2.0, [(p.pid, _cmdline(p)) for p in alive(tree)]


def _cmdline(p: psutil.Process) -> list[str]:
    """``p``'s command line; [] for a process that ended (a zombie included)."""
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _ppid(p: psutil.Process) -> int | None:
    """``p``'s parent PID; None for a process that ended."""
    try:
        return p.ppid()
    except psutil.Error:
        return None


@pytest.mark.parametrize("count", [1, 2])
def test_ctrl_c_stops_a_training_that_ignores_sigint_without_the_grace(tmp_path: Path, count: int) -> None:
    """Nothing catches SIGINT: torchwatch goes straight to SIGTERM (no 10 s wait for nothing)."""
    w = Watching(tmp_path / "r.json", [sys.executable, "-c", IGNORES_SIGINT])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(w.tree()) < 2:
            time.sleep(0.2)
        time.sleep(3)
        took, gone = w.stop_with([signal.SIGINT] * count, group=True)
    finally:
        w.kill()
    assert gone
    assert took < INTERRUPT_GRACE_S, took  # SIGTERM at once: the SIGINT grace would be waited for nothing
    assert w.report()["ended_by"] == "SIGINT"
    assert w.report()["target"]["exit_code"] == 128 + signal.SIGTERM


def test_sigint_to_torchwatchs_group_reaches_the_training_once(tmp_path: Path) -> None:
    """No terminal (CI): the training has a process group of its own, so a SIGINT to torchwatch's
    group reaches it once, passed on by torchwatch, never twice (a second KeyboardInterrupt would
    land in the training's own clean-up)."""
    count = tmp_path / "count"
    w = Watching(tmp_path / "r.json", [sys.executable, "-c", COUNTS_SIGINT, str(count)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(w.tree()) < 2:
            time.sleep(0.2)
        time.sleep(2)
        _, gone = w.stop_with([signal.SIGINT], group=True)
    finally:
        w.kill()
    assert gone
    assert count.read_text() == "1"
    assert w.report()["target"]["exit_code"] == 0  # it handled the one SIGINT and ended cleanly


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_ctrl_c_in_a_terminal_reaches_the_training_once(tmp_path: Path) -> None:
    """--headless in a terminal: the training shares the terminal (and torchwatch's group), so
    Ctrl-C reaches it from the terminal and torchwatch does not send it again."""
    from tests.tmux import Tmux

    tmux = Tmux()
    count, out = tmp_path / "count", tmp_path / "r.json"
    python = shlex.quote(sys.executable)
    # "trap : INT": the shell itself survives the Ctrl-C (torchwatch ends by SIGINT, which would
    # otherwise end the shell's script too, as it should) and prints torchwatch's status
    command = (
        f"trap : INT; cd {shlex.quote(str(REPO))} && {python} -m torchwatch run --headless --json {out} -- {python} -c "
        f"{shlex.quote(COUNTS_SIGINT)} {count}; echo TW_EXIT=$?; sleep 60"
    )
    tmux("new-session", "-d", "-x", "120", "-y", "30", "-s", "tw", command)
    try:
        assert "ready" in tmux.wait_for(lambda s: "ready" in s, 30.0)
        time.sleep(2)
        tmux("send-keys", "-t", "tw", "C-c")
        done = tmux.wait_for(lambda s: "TW_EXIT=" in s, 30.0)
    finally:
        tmux.kill()
    assert "TW_EXIT=130" in done, done
    assert count.read_text() == "1"
    assert json.loads(out.read_text())["ended_by"] == "SIGINT"


def test_duration_is_a_stop_torchwatch_asked_for_exit_0(cpu_bound_demo_run: Watched) -> None:
    """The README's "as in CI" run: --duration stops the training and torchwatch exits 0. The
    run is test_demos' cpu_bound one (``--duration 20``, the demo training 30 s)."""
    import jsonschema

    w = cpu_bound_demo_run
    assert w.code == 0, w.stderr[-2000:]
    assert w.report is not None, w.stderr[-2000:]
    jsonschema.validate(w.report, json.loads(SCHEMA.read_text()))
    assert w.report["ended_by"] == "duration" and w.report["target"]["exit_code"] == 130  # it saw SIGINT


def test_json_on_stdout_stays_json_while_the_training_prints(tmp_path: Path) -> None:
    code = "import time\nfor i in range(20):\n    print('training says', i, flush=True); time.sleep(0.1)\n"
    result = subprocess.run(
        [sys.executable, "-m", "torchwatch", "run", "--headless", "--json", "-", "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(result.stdout)  # the whole of stdout is the report
    assert data["schema"] == "torchwatch.report/1"
    assert "training says 19" in result.stderr and "verdict:" in result.stderr


def test_without_a_terminal_the_tui_gives_way_to_headless(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "torchwatch", "run", "--", sys.executable, "-c", "print('hi from the training')"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.splitlines()[0] == (
        "torchwatch: no terminal for the TUI (stdin or stderr is not a TTY): running --headless"
    )
    assert "hi from the training" in result.stdout and "verdict:" in result.stdout
    assert "\x1b[" not in result.stdout + result.stderr  # no escape codes in redirected output


def test_report_into_a_closed_pipe_ends_quietly_and_keeps_the_json(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)
    out = tmp_path / "r.json"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "torchwatch", "run", "--headless", "--json", str(out), "--", *SLEEP_2S],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=REPO,
        )
    finally:
        os.close(write)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    assert json.loads(out.read_text())["ended_by"] == "exit"


def test_json_into_a_directory(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "torchwatch", "run", "--headless", "--json", str(tmp_path), "--", *SLEEP_2S],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    written = list(tmp_path.glob("torchwatch-report-*.json"))
    assert len(written) == 1 and json.loads(written[0].read_text())["schema"] == "torchwatch.report/1"
    assert f"JSON report written to {written[0]}" in result.stderr


def test_attach_to_the_shell_torchwatch_runs_in_is_refused() -> None:
    """Without torchwatch's own branch a shell has nothing Python to watch: one line, exit 1."""
    python = shlex.quote(sys.executable)
    script = f"{python} -m torchwatch attach --headless --duration 20 $$; echo rc=$?"
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "rc=1" in result.stdout, result.stdout + result.stderr
    assert "is an ancestor of torchwatch" in result.stderr and "Traceback" not in result.stderr


def test_attach_to_a_training_that_started_torchwatch_watches_the_training(tmp_path: Path) -> None:
    """The target is torchwatch's parent: torchwatch (and py-spy) stay out of the watched tree."""
    trace = tmp_path / "trace.jsonl"
    out = tmp_path / "r.json"
    code = (
        "import os, subprocess, sys, threading, time\n"
        "stop = False\n"
        "def spin():\n"
        "    while not stop: sum(range(10_000))\n"
        "t = threading.Thread(target=spin); t.start()\n"
        f"subprocess.run([sys.executable, '-m', 'torchwatch', 'attach', '--headless', '--duration', '8',"
        f" '--trace', {str(trace)!r}, '--json', {str(out)!r}, str(os.getpid())])\n"
        "stop = True\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    watched = {r["main_pid"] for r in records if r["main_pid"] is not None}
    target = json.loads(out.read_text())["target"]["pid"]
    assert watched == {target}, (watched, target)  # never torchwatch itself


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.quiet  # the cpu_bound demo's label, on the screen and in the report
def test_tui_report_survives_its_terminal_closing(tmp_path: Path) -> None:
    """SIGHUP from a closed terminal: the TUI ends, the training is stopped, r.json is written."""
    from tests.tmux import Tmux, descendants

    tmux = Tmux()
    out = tmp_path / "r.json"
    python = shlex.quote(sys.executable)
    command = f"cd {shlex.quote(str(REPO))} && {python} -m torchwatch run --json {out} -- " + " ".join(
        shlex.quote(a) for a in CPU_BOUND
    )
    tmux("new-session", "-d", "-x", "100", "-y", "30", "-s", "tw", command + "; sleep 60")
    try:
        shell = int(tmux("list-panes", "-t", "tw", "-F", "#{pane_pid}").split()[0])
        screen = tmux.wait_for(lambda s: "cpu-bound" in s, 60.0)  # a wait: the label is the point, not how soon
        assert "cpu-bound" in screen, screen
        tree = [psutil.Process(p) for p in descendants(shell)]
        tmux.kill()  # the terminal closes: SIGHUP
        gone = gone_within(tree, 20.0)
    finally:
        tmux.kill()
    print(f"\nTUI, terminal closed: {len(tree)} processes gone after {gone} s")
    assert gone is not None, [(p.pid, p.cmdline()) for p in alive(tree)]
    data = json.loads(out.read_text())
    assert data["ended_by"] == "SIGHUP" and data["verdict"]["label"] in ("cpu-bound", "undetermined")
