"""Injection into live processes (torchwatch.inject): every interpreter found, a torch loop, and
each refusal made for real (another user, a traced, stopped, hooked or non-Python process,
another mount namespace), plus ``torchwatch doctor PID``."""

from __future__ import annotations

import glob
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containers import own_tmp_commands
from tests.integration.conftest import REPO
from tests.integration.injection import HOLDER, INJECT_TIMEOUT_S, _interpreter, running
from torchwatch.inject.injector import Injector, Payload, inject

pytestmark = pytest.mark.integration


# Checks every product against the first: a clobbered SSE/AVX register shows as a mismatch.


def _stderr_after_kill(proc: subprocess.Popen[str]) -> str:
    proc.kill()
    proc.wait()
    return proc.stderr.read() if proc.stderr else ""


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_injection_works_on_every_interpreter(version: str, scripts: Path) -> None:
    python = _interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine")
    with running([python, str(scripts / "loop.py"), "60"]) as target, Injector() as injector:
        in_thread = injector.inject(target.pid, timeout_s=INJECT_TIMEOUT_S)
        on_main = injector.inject(target.pid, Payload(thread=False), timeout_s=INJECT_TIMEOUT_S)
        assert in_thread.ok, in_thread.reason
        assert on_main.ok, on_main.reason
        for outcome in (in_thread, on_main):
            assert outcome.method == "ptrace"
            assert outcome.value["pid"] == target.pid
            assert outcome.value["python"].startswith(version + ".")
            assert outcome.result["module_file"].startswith(str(REPO))  # imported from torchwatch's install
        assert in_thread.result["main_thread"] is False and on_main.result["main_thread"] is True
        assert on_main.value["main_thread"] is True  # threading.main_thread() is still the real one
        assert target.poll() is None  # still running
        assert _stderr_after_kill(target) == ""  # nothing written to the target's output


def test_injection_into_a_running_torch_loop(scripts: Path) -> None:
    with running([sys.executable, str(scripts / "torch_loop.py"), "60"]) as target:
        time.sleep(1.0)
        outcome = inject(target.pid, timeout_s=INJECT_TIMEOUT_S)
        assert outcome.ok, outcome.reason
        assert outcome.value["torch"] is not None
        # held, and let go (how long: bench/inject.py, target <= 100 ms)
        assert outcome.tries is not None and outcome.held_s is not None and outcome.held_s > 0
        assert target.poll() is None


def test_repeated_injection_keeps_the_numbers_right(scripts: Path) -> None:
    """300 injections into a loop of matmuls: without the vector registers put back, a
    mismatch (or a crash in free()) came within ~80-150 injections on the build machine."""
    with running([sys.executable, str(scripts / "numbers_loop.py"), "300"]) as target, Injector() as injector:
        for n in range(300):
            outcome = injector.inject(target.pid, Payload(thread=n % 2 == 0), timeout_s=INJECT_TIMEOUT_S)
            assert target.poll() is None, f"the training died after {n + 1} injections: status {target.returncode}"
            assert outcome.ok, outcome.reason


def test_a_failing_payload_leaves_the_target_running(scripts: Path) -> None:
    with running([sys.executable, str(scripts / "loop.py"), "60"]) as target:
        outcome = inject(
            target.pid, Payload(module="torchwatch.inject.no_such_module", thread=False), timeout_s=INJECT_TIMEOUT_S
        )
        assert not outcome.ok and "ModuleNotFoundError" in outcome.reason and "was undone" in outcome.reason
        assert target.poll() is None
        err = _stderr_after_kill(target)
        assert err.count("\n") == 1 and "torchwatch: injected code failed" in err


def test_refuses_a_process_that_is_not_python() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        outcome = inject(sleeper.pid)
        assert not outcome.ok and outcome.method is None
        assert "is not a Python process" in outcome.reason
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_refuses_a_process_that_already_has_a_hook(scripts: Path) -> None:
    env = dict(os.environ, TORCHWATCH_HOOK="1")
    with running([sys.executable, str(scripts / "loop.py"), "60"], env=env) as target:
        outcome = inject(target.pid, timeout_s=INJECT_TIMEOUT_S)
        assert not outcome.ok and "already has a torchwatch hook" in outcome.reason


def test_refuses_a_stopped_process(scripts: Path) -> None:
    with running([sys.executable, str(scripts / "loop.py"), "60"]) as target:
        os.kill(target.pid, signal.SIGSTOP)
        try:
            time.sleep(0.2)
            outcome = inject(target.pid, timeout_s=INJECT_TIMEOUT_S)
            assert not outcome.ok and f"kill -CONT {target.pid}" in outcome.reason
        finally:
            os.kill(target.pid, signal.SIGCONT)


def test_refuses_a_process_someone_else_traces(scripts: Path) -> None:
    with running([sys.executable, str(scripts / "loop.py"), "60"]) as target:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(target.pid)], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "seized"
            outcome = inject(target.pid, timeout_s=INJECT_TIMEOUT_S)
            assert not outcome.ok and f"already traced by PID {holder.pid}" in outcome.reason
        finally:
            holder.kill()
            holder.wait()
            if holder.stdout is not None:
                holder.stdout.close()


def test_refuses_a_3_14_process_with_remote_debugging_disabled(scripts: Path) -> None:
    python = _interpreter("3.14")
    if python is None:
        pytest.skip("no python3.14 on this machine")
    env = dict(os.environ, PYTHON_DISABLE_REMOTE_DEBUG="1")
    with running([python, str(scripts / "loop.py"), "60"], env=env) as target:
        outcome = inject(target.pid, timeout_s=INJECT_TIMEOUT_S)
        assert not outcome.ok and "remote debugging is disabled" in outcome.reason


def _root_with(tool: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if shutil.which(tool) is None:
        pytest.skip(f"no {tool}")


def test_another_mount_namespace_is_injected_into_through_its_root(scripts: Path) -> None:
    """Refused before whenever the mount namespace differed. The same files: the injection's go to
    /tmp as for any process. A /tmp and /dev/shm of its own: they are placed in its /tmp through
    /proc/PID/root (the refusal, when neither works, is tests/unit/test_inject_checks.py's)."""
    _root_with("unshare")
    with running(["unshare", "--mount", sys.executable, str(scripts / "loop.py"), "60"]) as target:
        outcome = inject(target.pid, timeout_s=INJECT_TIMEOUT_S)
        assert outcome.ok, outcome.reason
        found = {f.check: f.finding for f in outcome.plan.findings}  # type: ignore[union-attr]
        assert "as torchwatch does" in found["mount-namespace"], found
    old = tempfile.mkdtemp(prefix="torchwatch-oldtmp-", dir="/var/tmp")
    own = " && ".join(  # the script (in /tmp) is opened before its own /tmp hides it; the venv and
        # the checkout stay seen where CI puts them under /tmp (tests/containers.py)
        [
            f"exec 3< {shlex.quote(str(scripts / 'loop.py'))}",
            *own_tmp_commands(old, keep=(sys.prefix, str(REPO))),
            f"mount -t tmpfs tmpfs /dev/shm && exec {shlex.quote(sys.executable)} /dev/fd/3 60",
        ]
    )
    try:
        with running(["unshare", "--mount", "sh", "-c", own]) as target:
            outcome = inject(target.pid, timeout_s=INJECT_TIMEOUT_S)
            assert outcome.ok, outcome.reason
            found = {f.check: f.finding for f in outcome.plan.findings}  # type: ignore[union-attr]
            assert f"placed there through /proc/{target.pid}/root" in found["mount-namespace"], found
    finally:
        os.rmdir(old)


def test_another_pid_namespace_works_and_the_target_sees_its_own_pid(scripts: Path) -> None:
    _root_with("unshare")
    with running(["unshare", "--pid", "--fork", "--kill-child", sys.executable, str(scripts / "loop.py"), "60"]) as u:
        # `ready PID` is printed by the inner process, with its namespace's PID
        inner = next(p for p in _children(u.pid))
        outcome = inject(inner, timeout_s=INJECT_TIMEOUT_S)
        assert outcome.ok, outcome.reason
        assert outcome.value["pid"] != inner  # its own view: PID 1 or 2 inside the namespace
        assert any(f.check == "pid-namespace" and f.level == "warn" for f in outcome.plan.findings)  # type: ignore[union-attr]


def _children(pid: int) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


@pytest.fixture(scope="module")
def two_users() -> Iterator[tuple[str, str]]:
    """Two throw-away unprivileged users, removed afterwards."""
    _root_with("useradd")
    names = [f"twi{secrets.token_hex(3)}a", f"twi{secrets.token_hex(3)}b"]
    for name in names:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield names[0], names[1]
    finally:
        for name in names:
            subprocess.run(["userdel", "-f", name], check=False, capture_output=True)


def _as(user: str) -> list[str]:
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]


SYSTEM_PYTHON = "/usr/bin/python3"  # a Python every user may run (pyenv's live under /root)


def _site_packages() -> str:
    import hypno  # type: ignore[import-untyped]

    return str(Path(hypno.__file__).resolve().parents[1])


def test_another_user_without_privilege_is_refused(scripts: Path, two_users: tuple[str, str]) -> None:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("no system python3")
    owner, other = two_users
    with running([*_as(owner), SYSTEM_PYTHON, str(scripts / "loop.py"), "60"]) as target:
        code = (
            "import json, sys\nfrom torchwatch.inject.injector import inject\n"
            "o = inject(int(sys.argv[1]))\nprint(json.dumps([o.ok, o.reason]))\n"
        )
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{_site_packages()}"}
        done = subprocess.run(
            [*_as(other), SYSTEM_PYTHON, "-c", code, str(target.pid)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        ok, reason = json.loads(done.stdout)
        assert not ok
        assert (
            f"belongs to {owner}" in reason
            and "without CAP_SYS_PTRACE" in reason
            and f"run torchwatch as {owner}" in reason
        )
        assert target.poll() is None


def test_root_injects_into_another_users_process(scripts: Path, two_users: tuple[str, str]) -> None:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("no system python3")
    owner, _ = two_users
    with running([*_as(owner), SYSTEM_PYTHON, str(scripts / "loop.py"), "60"]) as target:
        outcome = inject(target.pid, timeout_s=INJECT_TIMEOUT_S)
        assert outcome.ok, outcome.reason
        assert outcome.value["pid"] == target.pid
        leftovers = glob.glob(os.path.join(tempfile.gettempdir(), "torchwatch-inject-*"))
        assert not any(os.stat(p).st_uid != 0 for p in leftovers)  # nothing of the target's user is left behind
        assert _stderr_after_kill(target) == ""


def test_doctor_with_a_pid(scripts: Path) -> None:
    with running([sys.executable, str(scripts / "loop.py"), "60"]) as target:
        done = subprocess.run(
            [sys.executable, "-m", "torchwatch", "doctor", str(target.pid)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"ok    process: PID {target.pid} can be watched" in done.stdout
        assert "ok    inject/injector: ptrace injector (hypno)" in done.stdout
    gone = subprocess.run(
        [sys.executable, "-m", "torchwatch", "doctor", "--json", "999999999"], capture_output=True, text=True, cwd=REPO
    )
    assert gone.returncode == 1
    doc = json.loads(gone.stdout)
    assert not doc["ok"] and any(c["check"] == "process" and c["level"] == "fail" for c in doc["checks"])
