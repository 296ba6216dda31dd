"""``torchwatch doctor``: every check fed inputs that make it fail, and the command's exit code and JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from tests.unit.hosts import host
from torchwatch.cli import doctor
from torchwatch.inject.facts import Host, PythonVersion
from torchwatch.model.errors import TorchwatchError, UsageError
from torchwatch.model.readings import SourceStatus

HOST = host()


def test_proc_not_mounted_or_unreadable_fails(tmp_path: Path) -> None:
    assert doctor.check_proc(tmp_path, lambda: None).level == "fail"
    (tmp_path / "self").mkdir()
    (tmp_path / "self/stat").write_text("1 (x) S")

    def denied() -> None:
        raise PermissionError("hidepid=2")

    assert doctor.check_proc(tmp_path, denied).level == "fail"
    assert doctor.check_proc(tmp_path, lambda: None).level == "ok"


def test_a_proc_of_another_pid_namespace_fails_with_the_fix(tmp_path: Path) -> None:
    """``unshare --pid --fork`` without ``--mount-proc``: /proc/self names torchwatch by the parent
    namespace's PID (4242), not its own (1); every PID read there would be another process."""
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242/stat").write_text("4242 (python) R")
    (tmp_path / "self").symlink_to("4242")
    found = doctor.check_proc(tmp_path, lambda: None, own_pid=1)
    assert found.level == "fail" and "is another PID namespace's" in found.finding, found
    assert found.fix is not None and "--mount-proc" in found.fix and "torchwatch attach PID" in found.fix
    assert doctor.check_proc(tmp_path, lambda: None, own_pid=4242).level == "ok"


def test_commands_refuse_a_proc_of_another_pid_namespace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """run, attach (and burst, trial, serve's trainings: check_attachable), serve and detach refuse
    with one line and exit 1 before reading a PID; this process's own /proc passes."""
    from torchwatch.cli import main
    from torchwatch.watch import target

    assert target.proc_namespace_error() is None
    real_getpid = os.getpid
    monkeypatch.setattr(target.os, "getpid", lambda: 1 if real_getpid() != 1 else 2)
    with pytest.raises(TorchwatchError, match="another PID namespace's") as caught:
        target.check_attachable(real_getpid())
    assert caught.value.exit_code == 1
    capsys.readouterr()
    for argv in (["run", "--headless", "--", "true"], ["serve", "--duration", "1"], ["detach", "1234"]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("torchwatch: error: /proc is another PID namespace's") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("host", "level", "words"),
    [
        (dataclasses.replace(HOST, ptrace_scope=3), "warn", "ptrace_scope 3"),
        (dataclasses.replace(HOST, uids=(0, 0, 0)), "warn", "--cap-add SYS_PTRACE"),
        (dataclasses.replace(HOST, ptrace_scope=1), "warn", "only a process's ancestors"),
        (dataclasses.replace(HOST, ptrace_scope=2, cap_eff=1 << 19), "ok", "CAP_SYS_PTRACE"),
        (HOST, "ok", "this user's processes only"),
    ],
)
def test_ptrace(host: Host, level: str, words: str) -> None:
    f = doctor.check_ptrace(host)
    assert f.level == level and words in f.line()


def test_container_detection(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "root"
    (proc / "1").mkdir(parents=True)
    root.mkdir()
    (proc / "1/cgroup").write_text("0::/init.scope\n")
    assert doctor.container_kind(proc, root) is None
    (proc / "1/cgroup").write_text("0::/kubepods/besteffort/pod1/abc\n")
    assert doctor.container_kind(proc, root) == "kubepods"
    f = doctor.check_container("kubepods", HOST, "pid:[1]")
    assert "in a container (kubepods)" in f.finding
    assert "own PID namespace" in doctor.check_container(None, HOST, "pid:[99]").finding


@pytest.mark.parametrize(
    ("binary", "version", "py", "level", "words"),
    [
        (None, None, None, "warn", "not found"),
        ("/bin/py-spy", None, None, "warn", "does not run"),
        ("/bin/py-spy", "py-spy 0.3.14", PythonVersion(3, 12, False, ""), "warn", "cannot read Python 3.12"),
        ("/bin/py-spy", "py-spy 0.3.14", PythonVersion(3, 11, False, ""), "ok", "0.3.14"),
        ("/bin/py-spy", "py-spy 0.4.0", PythonVersion(3, 13, False, ""), "ok", "0.4.0"),
    ],
)
def test_pyspy(binary: str | None, version: str | None, py: PythonVersion | None, level: str, words: str) -> None:
    f = doctor.check_pyspy(binary, version, py)
    assert f.level == level and words in f.line()


def test_nvml_and_gpm() -> None:
    missing = doctor.check_nvml(SourceStatus.unavailable("NVML library not found", "install the driver"), [])
    assert missing.level == "warn" and "install the driver" in missing.line()
    assert doctor.check_gpm(False).level == "ok"
    found = doctor.check_nvml(SourceStatus.ok(), ["NVIDIA H100"])
    assert found.level == "ok" and "H100" in found.finding
    assert doctor.check_gpm(True).level == "warn"  # a GPU is there, GPM is not read yet


def test_psi_and_delayacct(tmp_path: Path) -> None:
    assert doctor.check_psi(tmp_path).level == "warn"
    (tmp_path / "pressure").mkdir()
    for k in ("cpu", "io", "memory"):
        (tmp_path / "pressure" / k).write_text("some avg10=0.00\n")
    assert doctor.check_psi(tmp_path).level == "ok"
    assert "before 5.14" in doctor.check_delayacct(tmp_path).finding
    (tmp_path / "sys/kernel").mkdir(parents=True)
    (tmp_path / "sys/kernel/task_delayacct").write_text("0\n")
    assert "sysctl kernel.task_delayacct=1" in doctor.check_delayacct(tmp_path).line()
    (tmp_path / "sys/kernel/task_delayacct").write_text("1\n")
    assert doctor.check_delayacct(tmp_path).level == "ok"


def test_cpu_quota_and_shm() -> None:
    assert doctor.check_cpu_quota(16, 2.5).level == "warn"
    assert doctor.check_cpu_quota(2, 2.0).level == "ok"
    small = doctor.check_shm(64 << 20)
    assert small.level == "warn" and "--shm-size" in small.line()
    assert doctor.check_shm(None).level == "warn"
    assert doctor.check_shm(8 << 30).level == "ok"


def test_hook_dir(tmp_path: Path) -> None:
    uid = os.geteuid()
    base = tmp_path / "torchwatch-x"
    assert "will be created" in doctor.check_hook_dir(base, uid).finding
    base.mkdir(mode=0o700)
    os.chmod(base, 0o700)
    assert doctor.check_hook_dir(base, uid).level == "ok"
    assert "belongs to uid" in doctor.check_hook_dir(base, uid + 1).finding
    os.chmod(base, 0o777)
    assert "open to other users" in doctor.check_hook_dir(base, uid).finding
    link = tmp_path / "link"
    link.symlink_to(base)
    assert "not a directory" in doctor.check_hook_dir(link, uid).finding

    def unreadable(_p: Path) -> os.stat_result:
        raise PermissionError(13, "Permission denied")

    assert doctor.check_hook_dir(base, uid, unreadable).level == "warn"
    assert not stat.S_ISLNK(os.lstat(base).st_mode)  # nothing was changed by the checks


def test_process_check_is_needed() -> None:
    def gone(pid: int) -> None:
        raise TorchwatchError(f"no process with PID {pid}", "check the PID with: pgrep -af python")

    f = doctor.check_process(999999, gone)
    assert f.level == "fail" and "pgrep" in f.line()


def _machine(tmp_path: Path, **kw: object) -> doctor.Machine:
    base = doctor.Machine(
        environ={"TORCHWATCH_DIR": str(tmp_path / "hooks")},
        pyspy="/bin/py-spy",
        pyspy_version=lambda _b: "py-spy 0.4.3",
        nvml=lambda: (SourceStatus.unavailable("NVML library not found", "expected without a GPU"), []),
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_command_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.doctor_command(None, machine=_machine(tmp_path)) == 0
    text = capsys.readouterr().out
    assert "ok    proc: psutil reads /proc" in text and "warn  nvml:" in text

    def broken() -> None:
        raise OSError("no /proc")

    assert doctor.doctor_command(None, as_json=True, machine=_machine(tmp_path, read_self=broken)) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == doctor.SCHEMA and doc["ok"] is False
    proc = next(c for c in doc["checks"] if c["check"] == "proc")
    assert proc["level"] == "fail" and proc["needed"] is True
    assert all(set(c) == {"level", "check", "finding", "fix", "needed"} for c in doc["checks"])


def test_command_with_a_pid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.doctor_command(str(os.getpid()), machine=_machine(tmp_path, attachable=lambda p: None)) == 0
    text = capsys.readouterr().out
    assert f"ok    process: PID {os.getpid()} can be watched" in text
    assert "inject/python: Python 3." in text and "inject/ptrace-permission" in text

    def not_python(pid: int) -> None:
        raise TorchwatchError(f"PID {pid} (bash) is not a Python process and has no Python child")

    assert doctor.doctor_command("1", machine=_machine(tmp_path, attachable=not_python)) == 1


@pytest.mark.parametrize("bad", ["abc", "0", "-5"])
def test_bad_pid_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError):
        doctor.doctor_command(bad)
