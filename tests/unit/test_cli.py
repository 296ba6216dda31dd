"""The command line's promises: option bounds, where the JSON goes, streams, exit statuses, logging,
the environment variables it lists, and the version (in-process unless a closed pipe is needed)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import torchwatch
from tests.unit.hookrecords import hook_record
from torchwatch import wire
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.cli import build_parser, main
from torchwatch.faces import report
from torchwatch.watch.bursts import wait_for_burst
from torchwatch.watch.session import Session, SessionOptions

# Names this change added are imported inside the tests that use them, so that on an older
# torchwatch each of those tests fails on its own instead of the whole module failing to import.

PACKAGE = Path(torchwatch.__file__).parent
README = PACKAGE.parent / "README.md"
CLI_DOC = PACKAGE.parent / "docs" / "cli.md"  # the reference the README links: exit statuses, environment


def _user_docs() -> str:
    """The README and the CLI reference it links, as one text ("" when neither is installed)."""
    return "\n".join(p.read_text() for p in (README, CLI_DOC) if p.exists())


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    _, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("torchwatch: error:") and "hint:" in lines[0]
    return lines[0]


# -- --window ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["0.001", "2.9", "301", "1e9", "inf", "nan", "-5", "abc"])
def test_window_out_of_bounds_is_refused_and_named(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--headless", "--window", value, "--", "definitely-not-a-command-xyz"]) == 2
    line = error_line(capsys)
    assert "--window" in line and "--duration" not in line


@pytest.mark.parametrize("value", ["3", "10", "300"])
def test_window_within_bounds_is_taken_as_given(value: str) -> None:
    from torchwatch.watch.session import WINDOW_MAX_S, WINDOW_MIN_S

    assert (WINDOW_MIN_S, WINDOW_MAX_S) == (3.0, 300.0)
    args = build_parser().parse_args(["run", "--window", value, "--", "python"])
    assert args.window == float(value)  # never capped


# -- --json DIR, --trace, atomic JSON -------------------------------------------------------------------
def test_json_into_a_directory_gets_a_file_named_after_the_pid(tmp_path: Path) -> None:
    from torchwatch.faces.report import json_target

    target = json_target(str(tmp_path), 4242)
    assert target.parent == tmp_path
    assert re.fullmatch(r"torchwatch-report-4242-\d{8}-\d{6}\.json", target.name)
    assert json_target(str(tmp_path / "r.json"), 4242) == tmp_path / "r.json"


def test_json_to_a_missing_directory_is_refused_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"{tmp_path}/no/such/dir/"
    assert main(["run", "--headless", "--json", missing, "--", "definitely-not-a-command-xyz"]) == 1
    assert "cannot write the JSON report" in error_line(capsys)


@pytest.mark.parametrize("where", ["missing-dir", "directory"])
def test_unwritable_trace_fails_up_front(where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "no" / "t.jsonl" if where == "missing-dir" else tmp_path
    # the command does not exist either: the --trace check must come first and stop everything
    assert main(["run", "--headless", "--trace", str(path), "--", "definitely-not-a-command-xyz"]) == 1
    line = error_line(capsys)
    assert f"cannot write the trace to {path}" in line


def test_json_is_written_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert hasattr(report, "write_atomic"), "no atomic writer"
    path = tmp_path / "r.json"
    path.write_text('{"old": true}\n')

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        report.write_atomic(path, json.dumps({"new": True}))
    assert json.loads(path.read_text()) == {"old": True}  # the old file, untouched
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind
    monkeypatch.undo()
    report.write_atomic(path, json.dumps({"new": True}))
    assert json.loads(path.read_text()) == {"new": True}


def test_json_replaces_a_symlink_instead_of_writing_through_it(tmp_path: Path) -> None:
    assert hasattr(report, "write_atomic"), "no atomic writer"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "r.json"
    link.symlink_to(victim)
    report.write_atomic(link, "{}\n")
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink() and link.read_text() == "{}\n"


# -- streams and exit statuses ---------------------------------------------------------------------
def _closed_pipe_run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m torchwatch ARGS`` with stdout a pipe whose reader has already gone."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "torchwatch", *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write)


def test_rules_list_into_a_closed_pipe_ends_quietly() -> None:
    result = _closed_pipe_run("rules", "list")
    assert result.stderr == ""
    assert result.returncode == 1  # the Python documentation's convention for EPIPE


def test_exit_statuses_are_in_the_help_and_the_cli_reference(capsys: pytest.CaptureFixture[str]) -> None:
    from torchwatch.cli import EXIT_STATUS

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "exit status:" in out
    for code, _text in EXIT_STATUS:
        assert re.search(rf"^\s+{re.escape(code)}\s", out, re.M), code
    if CLI_DOC.exists():
        docs = _user_docs()
        for code in ("128+N", "| 3 |", "| 2 |", "| 1 |", "| 0 |"):
            assert code in docs, code


# -- environment variables -------------------------------------------------------------------------
def _variables_read_by_the_code() -> set[str]:
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        found |= set(re.findall(r"\bTORCHWATCH_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    return found


def test_every_torchwatch_variable_the_code_reads_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    from torchwatch.cli import ENVIRONMENT

    in_code = _variables_read_by_the_code()
    assert "TORCHWATCH_SIGNAL" in in_code  # the scan itself works
    assert in_code <= set(ENVIRONMENT), f"not in cli.ENVIRONMENT: {sorted(in_code - set(ENVIRONMENT))}"
    with pytest.raises(SystemExit):
        main(["--help"])
    helptext = capsys.readouterr().out
    missing_help = [name for name in ENVIRONMENT if not re.search(rf"\b{name}\b", helptext)]
    assert not missing_help, missing_help
    if CLI_DOC.exists():
        docs = _user_docs()
        assert not [name for name in ENVIRONMENT if not re.search(rf"\b{name}\b", docs)]


# -- logging -----------------------------------------------------------------------------------------
@pytest.fixture
def log_file(tmp_path: Path) -> Any:
    from torchwatch.cli import configure_logging

    path = tmp_path / "torchwatch.log"
    configure_logging(verbose=True, log_file=path)
    yield path
    for handler in list(logging.getLogger("torchwatch").handlers):
        logging.getLogger("torchwatch").removeHandler(handler)
        handler.close()


def test_an_exception_in_the_analysis_thread_reaches_the_log_file(
    log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = Session(os.getpid(), load_rules(), SessionOptions(nvml=False, analysis_interval_s=0.02))

    def broken(now: float | None = None) -> Any:
        raise ZeroDivisionError("rule arithmetic went wrong")

    monkeypatch.setattr(session, "analyze", broken)
    thread = threading.Thread(target=session._tick_loop, args=([],))  # the rules alone, no source
    thread.start()
    time.sleep(0.2)
    session._stop.set()
    thread.join(5)
    text = log_file.read_text()
    assert "analysis failed" in text and "ZeroDivisionError: rule arithmetic went wrong" in text
    assert "Traceback" in text  # -v: the traceback too, once per failure
    assert text.count("WARNING") == 1  # the same error is warned about once, not every 20 ms


def test_log_options_are_taken_before_and_after_the_command() -> None:
    parser = build_parser()
    before = parser.parse_args(["-v", "--log-file", "a.log", "rules", "list"])
    after = parser.parse_args(["rules", "list", "-v", "--log-file", "b.log"])
    neither = parser.parse_args(["rules", "list"])
    assert (before.verbose, before.log_file) == (True, Path("a.log"))
    assert (after.verbose, after.log_file) == (True, Path("b.log"))
    assert (neither.verbose, neither.log_file) == (False, None)


def test_unwritable_log_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-file", str(tmp_path / "no" / "x.log"), "rules", "list"]) == 1
    assert "cannot write the log" in error_line(capsys)


# -- burst progress ----------------------------------------------------------------------------------
class FakeReader:
    """A hook that finishes burst 1 on its ``done_after``-th read."""

    def __init__(self, done_after: int) -> None:
        self.pid = 4242
        self.reads = 0
        self.done_after = done_after

    def record(self) -> wire.HookRecord:
        self.reads += 1
        if self.reads < self.done_after:
            return hook_record(self.pid, burst={"state": "running", "count": 0})
        return hook_record(self.pid, burst={"state": "idle", "count": 1, "last": {"id": 1, "steps": 3}})


def test_waiting_for_a_burst_reports_progress() -> None:
    waited: list[float] = []
    summary = wait_for_burst(FakeReader(4), 0, 10.0, poll_s=0.01, on_wait=waited.append)
    assert summary.id == 1 and summary.steps == 3
    assert len(waited) == 3 and waited == sorted(waited) and waited[0] > 0


class Stream:
    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.text = ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


def test_burst_progress_without_a_terminal_is_a_plain_line_now_and_then() -> None:
    from torchwatch.cli.burst import PLAIN_EVERY_S, progress

    stream = Stream(tty=False)
    with progress(4242, 60.0, stream) as on_wait:  # type: ignore[arg-type]
        for waited in (1.0, 5.0, PLAIN_EVERY_S + 0.5, PLAIN_EVERY_S + 2.0, 2 * PLAIN_EVERY_S + 1):
            on_wait(waited)
    lines = stream.text.splitlines()
    assert lines == [
        "torchwatch: still waiting for the burst of PID 4242 (10 s of at most 60 s)",
        "torchwatch: still waiting for the burst of PID 4242 (21 s of at most 60 s)",
    ]
    assert "\x1b" not in stream.text


def test_burst_progress_on_a_terminal_is_a_spinner() -> None:
    from torchwatch.cli.burst import progress

    stream = Stream(tty=True)
    with progress(4242, 60.0, stream) as on_wait:  # type: ignore[arg-type]
        on_wait(3.0)
        time.sleep(0.3)
    assert "waiting for the burst of PID 4242" in stream.text
    assert "\x1b[" in stream.text  # drawn and erased in place by rich's live display


# -- stop signals, version -----------------------------------------------------------------------------
def test_stop_signals_are_recorded_then_restored() -> None:
    from torchwatch.watch.lifecycle import StopSignals

    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stops:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops.wait(5)
        assert stops.received == [signal.SIGTERM] and stops.first == signal.SIGTERM
        # and the descriptor a loop sleeping in select() wakes on
        assert stops.wake_fd is not None and select.select([stops.wake_fd], [], [], 5)[0]
    assert signal.getsignal(signal.SIGTERM) is before
    assert stops.wake_fd is None  # closed with the handlers


_WAITING_LOOP = """
import sys, time
from torchwatch.watch.lifecycle import StopSignals
with StopSignals() as stops:
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        stops.wait(0.0002)  # the headless and serve loops' wait, short so that signals land in it
    print(len(stops.received), flush=True)
"""


def test_stop_signals_landing_in_the_watch_loops_wait_never_block_it() -> None:
    """A burst of SIGTERMs while the main thread sleeps in ``StopSignals.wait`` again and again:
    the loop still ends on time and counts them. The handler used to set a threading.Event,
    whose lock the same thread holds inside ``Event.wait``: a signal landing there blocked
    torchwatch for ever (seen as an ``attach`` that never ended on SIGTERM)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WAITING_LOOP, "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for _ in range(400):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.002)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert 1 <= int(out) <= 400  # signals sent while one is pending are merged into it


def test_a_wait_for_the_training_ends_at_its_exit_or_when_woken() -> None:
    """The headless loop sleeps in Launched.wait until the next verdict; the training's exit or a
    stop signal (its wake descriptor) ends the sleep at once."""
    from torchwatch.watch.lifecycle import launch

    r, w = os.pipe()
    try:
        child = launch(["sleep", "30"], stdout=subprocess.DEVNULL)
        try:
            t0 = time.monotonic()
            assert child.wait(0.3, wake_fd=r) is None  # nothing happened: the whole timeout
            assert 0.25 <= time.monotonic() - t0 < 5
            os.write(w, b"\0")
            t0 = time.monotonic()
            assert child.wait(20, wake_fd=r) is None
            assert time.monotonic() - t0 < 5  # woken, not 20 s
            os.kill(child.pid, signal.SIGKILL)
            t0 = time.monotonic()
            os.read(r, 1)  # no longer readable: only the exit can end this one early
            assert child.wait(20, wake_fd=r) == -signal.SIGKILL
            assert time.monotonic() - t0 < 5
        finally:
            child.close()
    finally:
        os.close(r)
        os.close(w)


def test_a_wait_and_a_poll_from_another_thread_both_see_the_exit() -> None:
    """The headless loop waits in Launched.wait on the main thread while the analysis thread calls
    poll(): two readers of the guard's status pipe once lost the exit line between one's select and
    the other's read, and ``run`` then blocked for good after its training had died (CI, 2026-11-29;
    the test's stacks: the main thread in os.read). Short commands, a poller that never rests: the
    main thread's wait must come back with the exit status each time."""
    import threading

    from torchwatch.watch.lifecycle import launch

    for _ in range(20):
        child = launch([sys.executable, "-c", "import time; time.sleep(0.05)"], stdout=subprocess.DEVNULL)
        stop = threading.Event()
        polled: list[int | None] = []

        def poller(child=child, stop=stop, polled=polled) -> None:  # type: ignore[no-untyped-def]
            while not stop.is_set():
                polled.append(child.poll())

        results: list[int | None] = []
        threads = [
            threading.Thread(target=poller, daemon=True),
            threading.Thread(target=lambda c=child, r=results: r.append(c.wait(30.0)), daemon=True),
        ]
        try:
            for t in threads:
                t.start()
            threads[1].join(40.0)
            assert not threads[1].is_alive(), "the wait never came back (blocked reading the guard's pipe)"
            assert results == [0]
        finally:
            stop.set()
            threads[0].join(5.0)
            child.close()
        assert polled and polled[-1] in (None, 0)
        assert child.poll() == 0


def test_version_comes_from_the_package_metadata(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyproject.toml is the one place: the package and --version read the installed metadata."""
    import importlib.metadata

    real = importlib.metadata.version("torchwatch-live")  # the distribution's own name (pyproject.toml)
    for flag in ("--version", "-V"):  # -V as py-spy, pip and most CLIs take it
        with pytest.raises(SystemExit) as stop:
            main([flag])
        assert stop.value.code == 0
        assert capsys.readouterr().out.strip() == f"torchwatch {real}"
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.8.7" if name == "torchwatch-live" else real)
    assert torchwatch.__version__ == "9.8.7"  # not a second copy of the number


@pytest.mark.parametrize(
    ("argv", "adaptive"), [([], True), (["--sampling", "adaptive"], True), (["--sampling", "fast"], False)]
)
def test_sampling_option_turns_the_adaptive_cadence_off(argv: list[str], adaptive: bool) -> None:
    from torchwatch.cli.options import WatchOptions

    for command in (["run", *argv, "--", "python"], ["attach", *argv, "1"]):
        opts = WatchOptions.from_args(build_parser().parse_args(command))
        assert opts.session_options(launched=command[0] == "run").adaptive is adaptive


def test_sampling_option_refuses_other_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attach", "--headless", "--sampling", "slow", "1"]) == 2
    line = error_line(capsys)
    assert "--sampling" in line and "fast" in line


def test_after_a_failed_injection_the_line_says_whether_the_training_still_runs() -> None:
    """A training whose main thread neither ran nor woke in the 0.5 s after a failed injection
    is said to be possibly stuck; one that computes runs on; one that is gone is said gone."""
    import signal
    import subprocess

    from torchwatch.cli.injecting import _runs_after_failure

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert "its main thread runs on" in _runs_after_failure(busy.pid)
        stopped.send_signal(signal.SIGSTOP)
        time.sleep(0.1)
        assert "has not run in the 0.5 s since" in _runs_after_failure(stopped.pid)
    finally:
        for p in (busy, stopped):
            p.kill()
            p.wait()
    assert "is gone" in _runs_after_failure(busy.pid)


def _subcommands() -> list[list[str]]:
    """Every command line that has a ``--help``: the top level, each sub-command, rules' own."""
    parser = build_parser()
    out: list[list[str]] = [[]]
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for name, sub in action.choices.items():
            out.append([name])
            for inner in sub._subparsers._group_actions if sub._subparsers else []:
                out += [[name, n] for n in inner.choices]
    return out


def test_every_help_has_no_doubled_percent_and_its_own_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    """A description is printed as written (argparse %-formats only option help): ``%%`` there
    shows doubled. Each command lists its own exit statuses: trial's are not run's."""
    from torchwatch.cli import COMMAND_EXIT_STATUS

    commands = _subcommands()
    assert {c[0] for c in commands if c} >= {"run", "attach", "trial", "compare", "burst", "detach", "serve"}
    for command in commands:
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "%%" not in out, command
        if len(command) == 1 and command[0] in COMMAND_EXIT_STATUS:
            statuses = out.split("exit status:", 1)[1].split("environment", 1)[0]
            for code, text in COMMAND_EXIT_STATUS[command[0]]:
                assert f"{code} {' '.join(text.split())}" in statuses, (command, code)
            if command[0] != "run":  # the training's own status and --fail-on's only where they apply
                assert "run: the training's own exit status" not in statuses, command
                assert ("--fail-on" in statuses) == ("--fail-on" in out.split("exit status:", 1)[0]), command
    assert set(COMMAND_EXIT_STATUS) == {c[0] for c in commands if len(c) == 1}


def test_every_registered_command_has_its_parser_help_line_exit_statuses_and_docs() -> None:
    """The command list (cli.COMMANDS) and the parser agree: each command has a sub-parser (and no
    sub-parser is left without a command), its line in ``torchwatch --help``, exit statuses its
    ``--help`` prints, and a line in the CLI reference."""
    from torchwatch.cli import COMMAND_EXIT_STATUS, COMMANDS

    parser = build_parser()
    (subparsers,) = parser._subparsers._group_actions if parser._subparsers else []
    assert isinstance(subparsers, argparse._SubParsersAction)
    names = [command.name for command in COMMANDS]
    assert len(set(names)) == len(names), names
    assert list(subparsers.choices) == names
    help_lines = {action.dest: action.help for action in subparsers._choices_actions}
    top_help = parser.format_help()
    docs = CLI_DOC.read_text() if CLI_DOC.exists() else ""
    for command in COMMANDS:
        assert command.help and help_lines.get(command.name) == command.help, command.name
        assert command.help in " ".join(top_help.split()), command.name
        rows = COMMAND_EXIT_STATUS.get(command.name)
        assert rows and rows == command.exit_status and all(code and text for code, text in rows), command.name
        own_help = subparsers.choices[command.name].format_help()
        assert all(f"  {code:6s} {text}" in own_help for code, text in rows), command.name
        if docs:
            assert f"torchwatch {command.name}" in docs, f"{command.name} is not in docs/cli.md"
