"""The suite's own hygiene (tests/conftest.py, tests/leftovers.py), checked on a pytest session run
in a subprocess: a failing test's busy processes are killed after it, a process that outlives
the session fails it, and what the tests start sees the default dispositions of the signals the
session was started with ignored or blocked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from tests import leftovers

REPO = Path(__file__).resolve().parents[2]

INNER = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    from pathlib import Path

    import pytest

    PIDS = Path(os.environ["PIDS_FILE"])
    BUSY = [sys.executable, "-c", "while True: pass"]


    def note(what, pid):
        with PIDS.open("a") as f:
            f.write(f"{what} {pid}\\n")


    @pytest.fixture(scope="session")
    def forgotten():
        proc = subprocess.Popen(BUSY, start_new_session=True)  # a session fixture that never ends it
        note("session", proc.pid)
        yield proc


    def test_fails_with_busy_processes_running():
        own_session = subprocess.Popen(BUSY, start_new_session=True)
        note("test", own_session.pid)
        # a shell that starts a busy process and exits: an orphan, re-parented to the test process
        shell = subprocess.run(
            ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
            capture_output=True, text=True, check=True,
        )
        note("orphan", int(shell.stdout))
        assert False, "this test fails with busy processes running"


    def test_children_start_with_default_signals(forgotten):
        status = subprocess.run(
            [sys.executable, "-c", "print(open('/proc/self/status').read())"],
            capture_output=True, text=True, check=True,
        ).stdout
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        bits = {name: int(fields[name], 16) for name in ("SigIgn", "SigBlk")}
        for signum in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1):
            assert not bits["SigIgn"] & (1 << (signum - 1)), (signum, bits)
            assert not bits["SigBlk"] & (1 << (signum - 1)), (signum, bits)
    """
)


def _as_a_background_job() -> None:
    """In the inner session: what a background job or a CI runner may start it with."""
    for signum in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_failing_tests_busy_processes_are_killed_and_a_leak_past_the_session_fails_it(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    pids_file = tmp_path / "pids.txt"
    env = dict(os.environ, PIDS_FILE=str(pids_file), PYTHONPATH=str(REPO))
    env.pop(leftovers.MARK, None)  # the inner session marks its own processes
    inner = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "--rootdir",
         str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, preexec_fn=_as_a_background_job,
    )  # fmt: skip
    out = inner.stdout + inner.stderr
    pids = {what: int(pid) for what, pid in (line.split() for line in pids_file.read_text().splitlines())}
    assert set(pids) == {"test", "orphan", "session"}, out
    assert [pid for pid in pids.values() if _alive(pid)] == [], out
    assert inner.returncode == 1, out
    assert "1 failed, 1 passed" in out, out  # the dispositions test passed: defaults in the child
    after_test, after_session = out.split("processes left running by tests")[1].split("processes the test session")
    for what in ("test", "orphan"):
        assert f"test_inner.py::test_fails_with_busy_processes_running: PID {pids[what]} " in after_test, out
    assert f"PID {pids['session']} (alive at the end of the test session)" in after_session, out


def test_a_process_that_left_the_tree_is_found_by_the_session_it_kept() -> None:
    """The group/session sweep: a process started in a session of its own starts a daemon (a
    double fork: the daemon's parent exits, so it is no longer below that process) and the daemon,
    still in that session, is found through it; this process's own session never is."""
    leader = subprocess.Popen(
        ["sh", "-c", f"({sys.executable} -c 'import time; time.sleep(60)' >/dev/null 2>&1 &); exec sleep 60"],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        daemons: list[psutil.Process] = []
        while not daemons and time.monotonic() < deadline:
            time.sleep(0.1)
            daemons = [
                p
                for p in leftovers.same_group_or_session([psutil.Process(leader.pid)])
                if p.pid != leader.pid and "time.sleep(60)" in " ".join(p.cmdline())
            ]
        assert daemons, "the daemon did not start"
        assert daemons[0].pid not in {p.pid for p in leftovers._below(leader.pid)}  # it left the tree
        assert os.getpid() not in {p.pid for p in leftovers.same_group_or_session([psutil.Process(leader.pid)])}
    finally:
        found = leftovers.same_group_or_session([psutil.Process(leader.pid)])
        left = leftovers.end(found, "test")
        leader.wait(10)
    assert {leader.pid, daemons[0].pid} <= {item.pid for item in left}
    assert not _alive(daemons[0].pid)
