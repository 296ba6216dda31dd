"""torchwatch.cli.main in-process: usage errors exit 2, "cannot watch" exits 1, one line, a hint."""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest

from torchwatch.cli import main

GOOD_RULE = """\
id = "mine"
label = "io-bound"
severity = "warning"
summary = "s"
when = "storage_wait_share >= 0.2"
source = "test"
"""


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("torchwatch: error:")
    assert "hint:" in line
    return line


def test_no_arguments_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    _, err = capsys.readouterr()
    assert "usage:" in err and "run" in err and "attach" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["run"], ["run", "--"], ["run", "--headless"]])
def test_run_without_command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "no command to run" in one_error_line(capsys)


@pytest.mark.parametrize("value", ["-1", "0", "abc", "inf", "nan"])
def test_bad_duration(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--duration", value, "--", "definitely-not-a-command-xyz"]) == 2
    assert "--duration" in one_error_line(capsys)


@pytest.mark.parametrize("value", ["-1", "0", "abc", "inf"])
def test_bad_hang_after(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attach", "--hang-after", value, "999999999"]) == 2
    assert "--hang-after" in one_error_line(capsys)


def test_fail_on_takes_hang_besides_the_labels(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attach", "--fail-on", "hang,io-bound", "999999999"]) == 1  # parsed: the PID is what fails
    assert "no process with PID 999999999" in one_error_line(capsys)
    assert main(["attach", "--fail-on", "hung", "999999999"]) == 2
    assert "labels from" in one_error_line(capsys)


def test_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attach", "--frobnicate", "1"]) == 2
    one_error_line(capsys)


def test_attach_not_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attach", "notanumber"]) == 2
    assert "PID must be a number" in one_error_line(capsys)


def test_attach_missing_pid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attach"]) == 2
    one_error_line(capsys)


def test_attach_no_such_pid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attach", "999999999"]) == 1
    assert "no process with PID 999999999" in one_error_line(capsys)


def test_attach_non_python_process(capsys: pytest.CaptureFixture[str]) -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert main(["attach", str(proc.pid)]) == 1
        line = one_error_line(capsys)
        assert "not a Python process" in line and str(proc.pid) in line
    finally:
        proc.kill()
        proc.wait()


def test_run_command_not_found(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the TUI log dir lands here
    assert main(["run", "--", "definitely-not-a-command-xyz"]) == 1
    assert "command not found: definitely-not-a-command-xyz" in one_error_line(capsys)


def test_run_command_not_found_leaves_no_temp_dir(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["run", "--", "definitely-not-a-command-xyz"]) == 1
    assert list(tmp_path.glob("torchwatch-*")) == []


def test_run_headless_command_not_found(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--headless", "--", "definitely-not-a-command-xyz"]) == 1
    assert "command not found" in one_error_line(capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--rules", "/nonexistent", "--", "definitely-not-a-command-xyz"],
        ["attach", "--rules", "/nonexistent", "999999999"],
    ],
)
def test_missing_rules_dir(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert "/nonexistent" in line and "no such directory" in line


def test_bad_rule_file_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.toml").write_text(GOOD_RULE.replace('"io-bound"', '"slow"'))
    assert main(["run", "--headless", "--rules", str(tmp_path), "--", "definitely-not-a-command-xyz"]) == 2
    line = one_error_line(capsys)
    assert f"{tmp_path / 'bad.toml'}:2" in line and "label must be one of" in line


def test_rule_error_hint_names_an_existing_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "good.toml").write_text(GOOD_RULE)
    assert main(["rules", "check", str(tmp_path)]) == 0


def test_unwritable_json_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--headless", "--json", "/nonexistent/dir/r.json", "--", "true"]) == 1
    assert "cannot write the JSON report" in one_error_line(capsys)


def _python_children(pid: int, n: int, timeout_s: float = 20.0) -> list[int]:
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        kids = [c.pid for c in psutil.Process(pid).children() if "python" in c.name()]
        if len(kids) >= n:
            return sorted(kids)
        time.sleep(0.05)
    raise AssertionError(f"{n} Python children of {pid} did not start")


@pytest.mark.parametrize("how_many", [2, 1])
def test_attach_to_a_tree_of_several_trainings_lists_them_instead_of_picking_one(
    how_many: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """`attach 1` on a host reached every Python process there and hopped its verdict between them.
    A non-Python PID whose tree holds several trainings is refused, with each one named; with one
    training under it, attach goes on to watch that one."""
    import os
    import shlex
    import signal
    import sys

    sleeper = f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(60)'"
    script = " & ".join([sleeper] * how_many) + " & wait"
    shell = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        kids = _python_children(shell.pid, how_many)
        code = main(["attach", "--headless", "--no-inject", "--duration", "0.5", str(shell.pid)])
        if how_many == 1:
            assert code == 0
            assert f"PID {kids[0]}" in capsys.readouterr().out  # the report of the one training
            return
        assert code == 1
        line = one_error_line(capsys)
        assert f"PID {shell.pid} is not a training and its tree holds 2 trainings" in line
        assert all(f"PID {k} (" in line for k in kids)
        assert "torchwatch serve" in line
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()


def test_json_path_where_root_cannot_create_a_file_is_refused_before_the_training(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """/proc passes os.access for root but takes no new file: refused up front, the training never started."""
    marker = tmp_path / "started"
    code = main(["run", "--headless", "--duration", "5", "--json", "/proc/nope.json", "--", "touch", str(marker)])
    assert code == 1
    assert "cannot write the JSON report to /proc/nope.json" in one_error_line(capsys)
    assert not marker.exists()


def test_a_report_that_could_not_be_written_at_the_end_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The folder passed the check, then went away while the training ran: the training ended well
    (status 0), but the report CI relies on is missing, so the exit is 1 and stderr says why."""
    folder = tmp_path / "out"
    folder.mkdir()
    # the training outlives the session's start (a bare rmdir could end before it, and a training
    # gone before it is watched has no report to miss: exit 0, seen once in CI)
    script = f"sleep 1; rmdir {shlex.quote(str(folder))}"
    code = main(["run", "--headless", "--json", str(folder / "r.json"), "--", "sh", "-c", script])
    out, err = capsys.readouterr()
    assert code == 1
    assert f"cannot write {folder / 'r.json'}" in err and "exit 1" in err
    assert "torchwatch report:" in out  # the text report is still printed


# -- issue 49: bad input and a closed stdout end in one line, never an internal error -------------
REPORT = Path(__file__).resolve().parents[1] / "fixtures" / "reports" / "today.json"


def test_a_report_holding_a_5000_digit_integer_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = REPORT.read_text().rstrip()
    big = tmp_path / "big.json"
    big.write_text(text[:-1] + ', "big": ' + "9" * 5000 + "}")
    assert main(["compare", str(big), str(REPORT)]) == 2
    assert "number too long" in one_error_line(capsys)


@pytest.mark.parametrize("how", ["closed", "reader gone"])
def test_a_closed_stdout_is_one_line_and_exit_1(how: str) -> None:
    import sys

    cmd = [sys.executable, "-m", "torchwatch", "compare", str(REPORT), str(REPORT)]
    if how == "closed":  # torchwatch ... >&-
        proc = subprocess.run(["bash", "-c", " ".join(cmd) + " >&-"], capture_output=True, text=True, timeout=60)
        code, err = proc.returncode, proc.stderr
    else:  # a pipe whose reader went away before the output was written
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
            assert child.stdout is not None and child.stderr is not None
            child.stdout.close()
            err = child.stderr.read()
            code = child.wait(60)
    assert code == 1, err
    assert "Traceback" not in err and "internal error" not in err
    if how == "reader gone":  # quietly, as `| head` expects (test_cli.py's closed-pipe test)
        assert err == ""
        return
    (line,) = err.splitlines()
    assert "stdout" in line and "not written" in line and "hint:" in line
