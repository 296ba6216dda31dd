"""The hook channel under attack: other users, stale directories, PID reuse, PID namespaces.

Each test reproduces one way the hook's files or signals were abused (issue 12) and checks it
no longer works. Cross-user cases run as real throw-away users (``make_user``, root only);
namespace cases under ``unshare --pid --fork --mount-proc`` (skipped where unavailable).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import users
from tests.unit.hookrun import hook_script
from torchwatch import wire
from torchwatch.model.readings import Status
from torchwatch.sources.hook import HookReader, HookSource, instance_of, send_burst_signal
from torchwatch.watch.lifecycle import hook_env

HERE = Path(__file__).parent
FAKE = HERE / "_fake_target.py"
SCRIPT = HERE / "_hook_script.py"
SMALL = HERE.parent / "integration" / "_small_train.py"
REPO = HERE.parents[1]
MakeUser = Callable[[], users.User]


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A fresh directory under /tmp that every user can reach (mode 1777, like /tmp)."""
    d = Path(tempfile.mkdtemp(prefix="tw-sec-", dir="/tmp"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _start_fake(args: list[str], user: users.User | None = None, **env: str) -> tuple[subprocess.Popen[str], Path]:
    """Start tests/unit/_fake_target.py (as ``user``); returns it and its hook directory."""
    if user is None:
        cmd = [sys.executable, str(FAKE), *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, **env})
    else:
        proc = user.popen([user.python(), str(FAKE), *args], stdout=subprocess.PIPE, env=user.env(**env))
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, f"fake target exited: {proc.wait()}"
    return proc, Path(line)


def _stop(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait(10)


def _write_state(d: Path, **fields: object) -> None:
    """Replace ``d/hook.json`` with a valid record of the process ``d`` names, ``fields`` on top."""
    inst = wire.Instance.from_dir_name(d.name)
    assert inst is not None
    rec = wire.HookRecord(inst, "3", "2.13", 1.0, int(signal.SIGUSR2), True, burst=wire.BurstState()).to_json()
    rec.update(fields)
    tmp = d / ".state.tmp"
    tmp.write_text(json.dumps(rec))
    os.chown(tmp, d.stat().st_uid, d.stat().st_gid)
    tmp.replace(d / wire.STATE_FILE)


# -- finding 1: root never chowns (or writes through) a path the target's user controls ------------
def test_root_burst_request_survives_a_symlink_swapping_user(make_user: MakeUser, shared_tmp: Path) -> None:
    """The target's user swaps request.json and every temp file in its hook directory for
    symbolic links to a root-only file while root asks for bursts: root's file is untouched."""
    victim = make_user()
    secret = Path(tempfile.mkdtemp(prefix="tw-root-", dir="/tmp")) / "root-only"
    secret.write_text("root's\n")
    os.chmod(secret, 0o600)
    base = shared_tmp / "base"
    target, d = _start_fake([str(base), "--catch", str(int(signal.SIGUSR2)), "--log", str(shared_tmp / "log")], victim)
    os.chmod(shared_tmp, 0o1777)
    swapper = victim.popen(
        [
            victim.python(),
            "-c",
            "import os, sys, time\n"
            "d, secret = sys.argv[1], sys.argv[2]\n"
            "end = time.monotonic() + 30\n"
            "while time.monotonic() < end:\n"
            "    for name in os.listdir(d):\n"
            "        if name.startswith('.tw-request') or name == 'request.json':\n"
            "            try:\n"
            "                os.unlink(os.path.join(d, name)); os.symlink(secret, os.path.join(d, name))\n"
            "            except OSError:\n"
            "                pass\n"
            "    try:\n"
            "        os.symlink(secret, os.path.join(d, 'request.json'))\n"
            "    except OSError:\n"
            "        pass\n",
            str(d),
            str(secret),
        ]
    )
    try:
        reader = HookReader(target.pid, d)
        sent = 0
        for _ in range(200):
            ok, _why = reader.request_burst(wire.BurstRequest(steps=2))
            sent += ok
        assert sent > 0  # the requests went through (the swapper only ever won races, never root's file)
    finally:
        _stop(swapper)
        _stop(target)
    st = secret.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
    assert secret.read_text() == "root's\n"
    shutil.rmtree(secret.parent)


# -- finding 2: the hook creates, changes and removes only what it made ---------------------------
def _run_hook_script(tw_dir: Path, tmp_path: Path, mode: str = "plain", **env: str) -> subprocess.CompletedProcess[str]:
    return hook_script(mode, tw_dir, tmp_path / "traces", **env)


def test_torchwatch_dir_runs_keeps_its_mode_and_entries(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "2023").mkdir(parents=True)
    (runs / "2023" / "model.pt").write_text("weights")
    os.chmod(runs, 0o755)
    os.utime(runs / "2023", (0, 0))
    r = _run_hook_script(runs, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[-1])["counters"]["steps"] > 0  # the hook ran there
    assert (runs / "2023" / "model.pt").read_text() == "weights"
    assert stat.S_IMODE(runs.stat().st_mode) == 0o755
    assert sorted(p.name for p in runs.iterdir()) == ["2023"]  # its own directory removed at exit


def test_trace_dir_keeps_its_mode(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    os.chmod(traces, 0o755)
    r = _run_hook_script(tmp_path / "tw", tmp_path, "burst")
    assert r.returncode == 0, r.stderr[-2000:]
    last = json.loads(r.stdout.splitlines()[-1])["state"]["burst"]["last"]
    assert last.get("error") is None and Path(last["trace_path"]).is_relative_to(traces)
    assert stat.S_IMODE(traces.stat().st_mode) == 0o755


def test_a_sticky_shared_dir_keeps_its_mode_and_another_users_entries(
    make_user: MakeUser, shared_tmp: Path, tmp_path: Path
) -> None:
    """Root's training with TORCHWATCH_DIR a 1777 directory: another user's entries there, even
    one named like a dead hook directory, stay; the directory stays 1777."""
    other = make_user()
    me = wire.self_instance()
    lookalike = wire.Instance(4194303, 1, me.pidns).dir_name  # a dead PID of this namespace
    for name in ("12345", lookalike):
        r = other.run(["mkdir", "-m", "0700", str(shared_tmp / name)])
        assert r.returncode == 0, r.stderr
        other.run(["touch", str(shared_tmp / name / wire.STATE_FILE)])
    r2 = _run_hook_script(shared_tmp, tmp_path)
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert json.loads(r2.stdout.splitlines()[-1])["counters"]["steps"] > 0
    assert stat.S_IMODE(shared_tmp.stat().st_mode) == 0o1777
    assert sorted(p.name for p in shared_tmp.iterdir()) == sorted(["12345", lookalike])
    assert (shared_tmp / lookalike / wire.STATE_FILE).exists()


def test_a_base_dir_of_another_user_is_refused_and_the_training_runs(make_user: MakeUser, tmp_path: Path) -> None:
    other = make_user()
    base = tmp_path / "theirs"
    base.mkdir(mode=0o755)
    os.chown(base, other.uid, other.gid)
    r = _run_hook_script(base, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[-1])["counters"] is None  # no hook, training fine
    assert r.stderr.count("torchwatch hook: off: cannot use") == 1 and f"uid {other.uid}" in r.stderr
    assert list(base.iterdir()) == [] and stat.S_IMODE(base.stat().st_mode) == 0o755


# -- finding 3: only SIGUSR1, SIGUSR2 and real-time signals, on both sides ---------------------------
@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("SIGUSR1", signal.SIGUSR1),
        ("usr2", signal.SIGUSR2),
        ("SIGRTMIN+2", signal.SIGRTMIN + 2),
        ("RTMAX-1", signal.SIGRTMAX - 1),
        (str(int(signal.SIGUSR1)), signal.SIGUSR1),
    ],
)
def test_burst_signals_allowed(text: str, want: int) -> None:
    assert wire.parse_signal(text) == int(want)


@pytest.mark.parametrize(
    "text", ["SIGKILL", "SIGTERM", "SIGINT", "HUP", "SIGSTOP", "abc", "999", "-1", "9", "RTMIN+99"]
)
def test_other_signals_are_refused(text: str) -> None:
    with pytest.raises(wire.WireError, match="not allowed"):
        wire.parse_signal(text)


@pytest.mark.parametrize("name", ["SIGKILL", "SIGTERM", "SIGINT"])
def test_hook_refuses_a_stopping_signal_and_import_torch_works(tmp_path: Path, name: str) -> None:
    r = _run_hook_script(tmp_path / "tw", tmp_path, "signals", TORCHWATCH_SIGNAL=name)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.splitlines()[-1])
    st = out["state"]
    assert st["signal"] == 0 and not st["signal_owned"]
    assert any("not allowed" in e for e in st["errors"])
    assert out["handlers"][name] == "default"  # SIGTERM still stops the training, SIGINT still interrupts it


def test_reader_never_sends_a_signal_outside_the_burst_set(tmp_path: Path) -> None:
    log = tmp_path / "log"
    target, d = _start_fake([str(tmp_path / "tw"), "--catch", str(int(signal.SIGTERM)), "--log", str(log)])
    try:
        _write_state(d, signal=int(signal.SIGTERM))  # a hook.json that asks for SIGTERM
        reader = HookReader(target.pid, d)
        ok, why = reader.burst_possible()
        assert not ok and "bursts are off" in why
        assert reader.request_burst() == (False, why)
        sent, msg = send_burst_signal(target.pid, instance_of(target.pid), int(signal.SIGTERM))
        assert not sent and "not a burst signal" in msg
        time.sleep(0.3)
        assert not log.exists() and target.poll() is None
    finally:
        _stop(target)


def test_burst_signal_goes_through_a_pidfd_to_the_process_checked(tmp_path: Path) -> None:
    log = tmp_path / "log"
    target, _ = _start_fake([str(tmp_path / "tw"), "--catch", str(int(signal.SIGUSR2)), "--log", str(log)])
    try:
        inst = instance_of(target.pid)
        stale = wire.Instance(inst.pid, inst.start + 1, inst.pidns)  # as if the PID were reused
        assert send_burst_signal(target.pid, stale, int(signal.SIGUSR2)) == (
            False,
            f"PID {target.pid} is now another process: not sent",
        )
        assert send_burst_signal(target.pid, inst, int(signal.SIGUSR2))[0]
        deadline = time.monotonic() + 5
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log.read_text().split() == [str(int(signal.SIGUSR2))]
    finally:
        _stop(target)


# -- finding 5: hook files are checked, bound to the process instance -------------------------------
def test_a_planted_hook_dir_of_another_user_cannot_make_the_victims_burst_sigint_its_training(
    make_user: MakeUser, shared_tmp: Path
) -> None:
    """Another user pre-creates $TMPDIR/torchwatch-<victim uid> with a hook.json saying
    "signal": 2 for the victim's process; the victim's own `torchwatch burst` refuses."""
    victim, attacker = make_user(), make_user()
    training = victim.popen(
        [victim.python(), "-c", "import time\nwhile True: time.sleep(0.1)"], env=victim.env(TMPDIR=str(shared_tmp))
    )
    try:
        time.sleep(0.5)
        inst = instance_of(training.pid)
        planted = shared_tmp / f"torchwatch-{victim.uid}" / inst.dir_name
        rec = wire.HookRecord(inst, "3", "2.13", 1.0, 2, True, burst=wire.BurstState()).to_json()
        code = (
            "import json, os, sys\n"
            "os.makedirs(sys.argv[1])\n"
            "os.chmod(os.path.dirname(sys.argv[1]), 0o755); os.chmod(sys.argv[1], 0o755)\n"
            "open(os.path.join(sys.argv[1], 'hook.json'), 'w').write(sys.argv[2])\n"
        )
        r = attacker.run([attacker.python(), "-c", code, str(planted), json.dumps(rec)])
        assert r.returncode == 0, r.stderr
        b = victim.run(
            [victim.python(), "-m", "torchwatch", "burst", str(training.pid), "--wait", "5"],
            env=victim.env(TMPDIR=str(shared_tmp)),
            timeout=120,
        )
        assert b.returncode == 1 and "Traceback" not in b.stderr
        assert f"belongs to uid {attacker.uid}" in b.stderr, b.stderr
        time.sleep(0.5)
        assert training.poll() is None  # no SIGINT reached it
    finally:
        _stop(training)


def test_pid_reuse_or_a_stale_dir_gives_no_hook_and_no_signal(tmp_path: Path) -> None:
    """An unrelated process that catches SIGUSR2 now has the PID of a dead training whose
    directory is still there: no signal, and no "hook ok" with the dead training's numbers."""
    log = tmp_path / "log"
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGUSR2, lambda s, f: open(sys.argv[1], 'a').write('usr2\\n'))\n"
            "while True: time.sleep(0.1)",
            str(log),
        ]
    )
    try:
        time.sleep(0.5)
        inst = instance_of(daemon.pid)
        base = tmp_path / "tw"
        base.mkdir(mode=0o700)
        # the dead training's files: the old layout named by the bare PID, and the new layout
        # named after this PID's instance but written by an earlier process of the same PID
        dead = wire.Instance(inst.pid, inst.start - 1, inst.pidns)
        for d in (base / str(inst.pid), base / inst.dir_name):
            d.mkdir(mode=0o700)
            rec = wire.HookRecord(dead, "3", "2.13", 1.0, int(signal.SIGUSR2), True).to_json()
            (d / wire.STATE_FILE).write_text(json.dumps(rec))
        for directory in (base / str(inst.pid), base / inst.dir_name):
            reader = HookReader(daemon.pid, directory)
            assert reader.read(time.monotonic()) is None
            ok, why = reader.request_burst()
            assert not ok, why
        stale = HookReader(daemon.pid, base / inst.dir_name)
        stale.record()
        assert "written by process" in stale.reason and "stale or foreign" in stale.reason
        source = HookSource(expected=False)
        source._readers[daemon.pid] = stale
        assert source.sample(time.monotonic(), daemon.pid) == []
        assert source.status.status is Status.UNAVAILABLE and "stale" in (source.status.reason or "")
        time.sleep(0.3)
        assert not log.exists() and daemon.poll() is None
    finally:
        _stop(daemon)


def test_control_characters_in_hook_strings_never_reach_the_terminal(tmp_path: Path) -> None:
    target, d = _start_fake([str(tmp_path / "tw")])
    try:
        _write_state(d, errors=["\x1b[2J\x1b]0;pwned\x07 cleared", "tab\there\u202eevil"], torch="2.13\x1b[31m")
        info = HookReader(target.pid, d).info()
        assert info is not None
        assert info["errors"] == ["[2J]0;pwned cleared", "tabhereevil"] and info["torch"] == "2.13[31m"
    finally:
        _stop(target)


# -- finding 6: PID namespaces sharing /tmp -----------------------------------------------------------
def _unshare_ok() -> str:
    if shutil.which("unshare") is None:
        return "unshare not found"
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False)
    return "" if r.returncode == 0 else f"unshare --pid refused: {r.stderr.decode(errors='replace').strip()}"


needs_unshare = pytest.mark.skipif(bool(_unshare_ok()), reason=_unshare_ok() or "ok")


def _ns_train(tw: Path, tmp_path: Path, seconds: float) -> subprocess.Popen[str]:
    """A hooked small training as PID 1 of a new PID namespace, publishing under ``tw``."""
    env = {**hook_env(), "TORCHWATCH_DIR": str(tw), "TORCHWATCH_TRACE_DIR": str(tmp_path / "traces")}
    return subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(SMALL), "--seconds", str(seconds)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@needs_unshare
def test_two_trainings_with_the_same_namespace_pid_keep_their_own_counters(tmp_path: Path) -> None:
    """Both trainings are PID 1 of their namespace and share TORCHWATCH_DIR: before, the second
    truncated the first's mapped counters (SIGBUS). Now each has its own directory."""
    tw = tmp_path / "tw"
    first = _ns_train(tw, tmp_path, 8.0)
    time.sleep(4.0)  # the first is stepping when the second starts
    second = _ns_train(tw, tmp_path, 4.0)
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while (first.poll() is None or second.poll() is None) and time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            seen.update(p.name for p in tw.iterdir())
        time.sleep(0.1)
    out1, err1 = first.communicate(timeout=60)
    out2, err2 = second.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, (first.returncode, err1[-1500:], err2[-1500:])
    assert "small_train:" in out1 and "small_train:" in out2
    names = [wire.Instance.from_dir_name(n) for n in seen]
    assert len(names) == 2 and all(n is not None and n.pid == 1 for n in names)
    assert len({n.pidns for n in names if n is not None}) == 2


@needs_unshare
def test_a_hooked_process_in_another_pid_namespace_leaves_live_host_dirs_alone(tmp_path: Path) -> None:
    tw = tmp_path / "tw"
    host, d = _start_fake([str(tw)])
    try:
        inst = instance_of(host.pid)
        assert HookReader(host.pid, d).read(time.monotonic()) is not None
        ns = _ns_train(tw, tmp_path, 2.0)  # its hook looks for stale directories at start
        _out, err = ns.communicate(timeout=120)
        assert ns.returncode == 0, err[-2000:]
        assert d.exists() and d.name == inst.dir_name
        assert HookReader(host.pid, d).read(time.monotonic()) is not None
    finally:
        _stop(host)


@needs_unshare
def test_without_its_own_proc_a_namespaced_hook_removes_nothing(tmp_path: Path) -> None:
    """``unshare --pid`` without a new /proc: /proc shows the host's PIDs, so nothing there
    proves a PID of the namespace dead: no directory is removed."""
    tw = tmp_path / "tw"
    tw.mkdir(mode=0o700)
    code = (
        "import os, sys\n"
        "from torchwatch import wire\n"
        "me = wire.self_instance()\n"
        "dead = wire.Instance(4194303, 1, me.pidns)\n"
        "os.mkdir(os.path.join(sys.argv[1], dead.dir_name), 0o700)\n"
        "fd = wire.open_dir(sys.argv[1], (os.geteuid(),), private=True)\n"
        "print(wire.proc_is_own_namespace(), wire.remove_stale(fd, me))\n"
    )
    r = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", code, str(tw)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "[]"]
    assert len(list(tw.iterdir())) == 1


def test_a_planted_link_on_the_path_is_named_not_permission_denied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 49: with fs.protected_symlinks=1 the kernel refuses (EACCES) to let root follow a link
    # another user planted in a sticky directory; the refusal read "Permission denied". The
    # kernel's refusal is simulated here (the sysctl is the machine's, not a test's to change).
    import errno

    from torchwatch.wire import files

    (tmp_path / "real" / "hooks").mkdir(parents=True)
    (tmp_path / "planted").symlink_to(tmp_path / "real")
    target = tmp_path / "planted" / "hooks"
    real_open = os.open

    def kernel(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fsdecode(path) == str(target):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(files.os, "open", kernel)
    with pytest.raises(files.Unsafe) as caught:
        files.open_dir(target, (os.geteuid(),), private=False)
    assert (
        str(caught.value) == f"{tmp_path / 'planted'} is a symbolic link (planted?): {target} was not opened through it"
    )
    # without a link on the way the error is the kernel's own, unchanged
    monkeypatch.setattr(
        files.os, "open", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
    )
    with pytest.raises(PermissionError):
        files.open_dir(tmp_path / "real" / "hooks", (os.geteuid(),), private=False)
