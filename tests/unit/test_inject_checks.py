"""The pre-injection checks (torchwatch.inject.checks / facts) on built facts and a fake /proc."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from tests.unit.hosts import host
from torchwatch.inject import checks, facts
from torchwatch.inject._ptrace import Maps, classify
from torchwatch.inject.facts import Host, PythonVersion, Target

CAP_PTRACE = 1 << facts.CAP_SYS_PTRACE


def target(**kw: object) -> Target:
    base = Target(
        pid=4242,
        name="python3.12",
        state="S",
        uids=(1000, 1000, 1000),
        gids=(1000, 1000, 1000),
        groups=(),
        tracer_pid=0,
        tracer_name="",
        ns_pids=(4242,),
        start_ticks=123,
        proc_owner=1000,
        exe="/usr/bin/python3.12",
        python=PythonVersion(3, 12, False, "exe python3.12"),
        environ={},
        cmdline=("python3.12", "train.py"),
        namespaces={"pid": "pid:[1]", "mnt": "mnt:[2]", "user": "user:[3]"},
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def plan(h: Host, t: Target, **kw: object) -> checks.Plan:
    kw.setdefault("missing_injector", None)
    kw.setdefault("hooked", lambda _t: None)
    kw.setdefault("stat_fn", lambda p: os.stat_result((0o40755, 0, 0, 0, 0, 0, 0, 0, 0, 0)))
    kw.setdefault("view", facts.View(None))  # the target's files are ours (no container)
    return checks.evaluate(h, t, **kw)  # type: ignore[arg-type]


def failed(p: checks.Plan) -> dict[str, str]:
    return {f.check: f.finding for f in p.refusals}


def test_same_user_on_a_classic_kernel_is_allowed_by_ptrace() -> None:
    p = plan(host(), target())
    assert p.method == "ptrace" and not p.refusals
    assert p.reason() == ""


def test_other_user_without_cap_sys_ptrace_is_refused_with_the_fix() -> None:
    p = plan(host(), target(uids=(1001, 1001, 1001), gids=(1001, 1001, 1001), proc_owner=1001))
    assert p.method is None
    assert "without CAP_SYS_PTRACE" in failed(p)["ptrace-permission"]
    assert "or with sudo" in p.reason()


def test_a_setuid_style_saved_uid_counts_as_another_user() -> None:
    p = plan(host(), target(uids=(1000, 1000, 0)))
    assert "ptrace-permission" in failed(p)


def test_root_without_cap_sys_ptrace_is_told_about_the_container_capability() -> None:
    p = plan(host(uids=(0, 0, 0), gids=(0, 0, 0)), target())
    assert "--cap-add SYS_PTRACE" in p.reason()


def test_cap_sys_ptrace_reaches_other_users() -> None:
    p = plan(host(uids=(0, 0, 0), cap_eff=CAP_PTRACE), target(uids=(1001,) * 3, gids=(1001,) * 3))
    assert p.method == "ptrace"


def test_a_non_dumpable_process_of_the_same_user_needs_the_capability() -> None:
    p = plan(host(), target(proc_owner=0))
    assert "not dumpable" in failed(p)["ptrace-permission"]


@pytest.mark.parametrize(
    ("scope", "cap", "allowed", "words"),
    [
        (None, 0, True, ""),
        (0, 0, True, ""),
        (1, 0, False, "only a process's ancestors"),
        (1, CAP_PTRACE, True, ""),
        (2, 0, False, "only CAP_SYS_PTRACE"),
        (2, CAP_PTRACE, True, ""),
        (3, CAP_PTRACE, False, "root included"),
    ],
)
def test_yama_ptrace_scope(scope: int | None, cap: int, allowed: bool, words: str) -> None:
    p = plan(host(ptrace_scope=scope, cap_eff=cap), target())
    assert (p.method is not None) is allowed
    if words:
        assert words in failed(p)["yama"]


def test_ptrace_scope_3_read_from_a_fake_proc(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel/yama").mkdir(parents=True)
    (tmp_path / "sys/kernel/yama/ptrace_scope").write_text("3\n")
    assert facts.ptrace_scope(tmp_path) == 3
    (tmp_path / "sys/kernel/yama/ptrace_scope").unlink()
    assert facts.ptrace_scope(tmp_path) is None  # no Yama


@pytest.mark.parametrize(
    ("state", "tracer", "words"),
    [("Z", 0, "has exited"), ("T", 0, "kill -CONT"), ("t", 0, "stopped by a tracer"), ("S", 77, "traced by PID 77")],
)
def test_zombie_stopped_and_traced_processes_are_refused(state: str, tracer: int, words: str) -> None:
    p = plan(host(), target(state=state, tracer_pid=tracer, tracer_name="gdb" if tracer else ""))
    assert "process-state" in failed(p) and words in p.reason()


def test_a_process_that_is_not_python_is_refused() -> None:
    p = plan(host(), target(name="bash", exe="/usr/bin/bash", python=None, cmdline=("bash",)))
    assert "is not a Python process" in failed(p)["python"]
    assert "injector" not in {f.check for f in p.findings}  # one reason, not two


def test_python_older_than_3_10_is_refused() -> None:
    p = plan(host(), target(python=PythonVersion(3, 9, False, "exe python3.9")))
    assert "3.10 or newer" in failed(p)["python"]


def test_an_already_hooked_process_is_refused() -> None:
    p = plan(host(), target(), hooked=lambda t: "TORCHWATCH_HOOK=1 in its environment")
    assert "already has a torchwatch hook" in failed(p)["hook"]


def test_hook_evidence_from_the_environment_and_from_the_published_directory(tmp_path: Path) -> None:
    assert checks.hook_evidence(target(environ={"TORCHWATCH_HOOK": "1"})) is not None
    t = target(environ={"TORCHWATCH_DIR": str(tmp_path)})
    assert checks.hook_evidence(t) is None
    # the hook's own directory name: <pid>-<start>-<pidns> (wire.Instance.dir_name)
    (tmp_path / "4242-123-1").mkdir()
    (tmp_path / "4242-123-1/hook.json").symlink_to("/etc/passwd")
    assert checks.hook_evidence(t) is None  # a link is not a hook: nothing is followed
    (tmp_path / "4242-123-1/hook.json").unlink()
    (tmp_path / "4242-123-1/hook.json").write_text("{}")
    assert checks.hook_evidence(t) is not None
    # another instance of the same PID (another start time) is not this process's hook
    assert checks.hook_evidence(dataclasses.replace(t, start_ticks=124)) is None
    # a directory named by the PID alone is nobody's hook
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242/hook.json").write_text("{}")
    assert checks.hook_evidence(dataclasses.replace(t, start_ticks=124)) is None


def test_another_mount_namespace_is_refused_only_when_no_files_can_reach_it() -> None:
    """A container sees /tmp as torchwatch does, or has its own /tmp torchwatch reaches through its
    root: injection goes ahead (a warning when it does not see torchwatch's package). Refused, with
    why, only when neither works. Another PID namespace is only a warning."""
    t = target(namespaces={"pid": "pid:[9]", "mnt": "mnt:[9]", "user": "user:[3]"}, ns_pids=(4242, 7))
    root = "/proc/4242/root"
    shared = plan(host(), t, view=facts.View(root, package=True, shared_tmp="/tmp"))
    assert shared.method == "ptrace", shared.refusals
    mnt = next(f for f in shared.findings if f.check == "mount-namespace")
    assert mnt.level == "ok" and "sees /tmp as torchwatch does" in mnt.finding
    own = plan(host(), t, view=facts.View(root, package=False, own_tmp="/tmp"))
    assert own.method == "ptrace", own.refusals
    assert "placed there through /proc/4242/root" in next(
        f.finding for f in own.findings if f.check == "mount-namespace"
    )
    pkg = next(f for f in own.findings if f.check == "package-view")
    assert pkg.level == "warn" and "/opt/tw" in pkg.finding
    neither = plan(host(), t, view=facts.View(root, package=True, why="/tmp: Permission denied"))
    assert neither.method is None
    assert "cannot place files it can read: /tmp: Permission denied" in failed(neither)["mount-namespace"]
    warn = next(f for f in shared.findings if f.check == "pid-namespace")
    assert warn.level == "warn" and "PID 7 inside" in warn.finding
    same = plan(host(), dataclasses.replace(t, namespaces={**t.namespaces, "mnt": "mnt:[2]"}))
    assert same.method == "ptrace" and not any(f.check == "mount-namespace" for f in same.findings)


@pytest.mark.parametrize(
    ("environ", "cmdline", "disabled"),
    [
        ({}, ("python3.14", "train.py"), None),
        ({"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, ("python3.14", "train.py"), "PYTHON_DISABLE_REMOTE_DEBUG"),
        ({"PYTHON_DISABLE_REMOTE_DEBUG": ""}, ("python3.14", "train.py"), None),
        ({"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, ("python3.14", "-E", "train.py"), None),
        ({"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, ("python3.14", "-uI", "train.py"), None),
        ({}, ("python3.14", "-X", "disable_remote_debug", "train.py"), "-X disable_remote_debug"),
        ({}, ("python3.14", "-Xdisable_remote_debug", "-m", "pkg"), "-X disable_remote_debug"),
        ({}, ("python3.14", "train.py", "-X", "disable_remote_debug"), None),  # the script's own argument
    ],
)
def test_remote_debug_disabled(environ: dict[str, str], cmdline: tuple[str, ...], disabled: str | None) -> None:
    why = checks.remote_debug_disabled(environ, cmdline)
    assert (why is None) is (disabled is None)
    if disabled:
        assert why is not None and disabled in why


def test_method_for_3_14_targets() -> None:
    py314 = PythonVersion(3, 14, False, "exe python3.14")
    t = target(python=py314, cmdline=("python3.14", "train.py"))
    same = host(python=(3, 14), remote_debug_enabled=True)
    assert plan(same, t).method == "remote_exec"
    other = plan(host(python=(3, 11)), t)
    assert other.method == "ptrace"
    assert (
        "sys.remote_exec needs torchwatch on Python 3.14"
        in next(f for f in other.findings if f.check == "injector").finding
    )
    off = plan(same, dataclasses.replace(t, environ={"PYTHON_DISABLE_REMOTE_DEBUG": "1"}))
    assert off.method is None and "remote debugging is disabled" in failed(off)["injector"]
    free = plan(same, dataclasses.replace(t, python=PythonVersion(3, 14, True, "exe python3.14t")))
    assert free.method == "ptrace"  # PEP 768 needs the same build (with or without the GIL)


def test_a_missing_injector_is_a_refusal_with_the_install_command() -> None:
    p = plan(host(), target(), missing_injector="the Python package hypno is not installed")
    assert p.method is None and "pip install" in p.reason()


def _st(mode: int, uid: int = 0, gid: int = 0) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 0, uid, gid, 0, 0, 0, 0))


def test_readable_by_walks_the_path_with_owner_group_and_other_bits() -> None:
    tree = {
        "/": _st(stat.S_IFDIR | 0o755),
        "/root": _st(stat.S_IFDIR | 0o700),
        "/root/tw": _st(stat.S_IFDIR | 0o755),
        "/root/tw/p.py": _st(stat.S_IFREG | 0o644),
        "/srv": _st(stat.S_IFDIR | 0o750, 0, 50),
        "/srv/p.py": _st(stat.S_IFREG | 0o640, 0, 50),
    }
    look = tree.__getitem__
    assert checks.readable_by("/root/tw/p.py", 1000, [1000], look) == "/root"
    assert checks.readable_by("/root/tw/p.py", 0, [0], look) is None
    assert checks.readable_by("/srv/p.py", 1000, [50], look) is None
    assert checks.readable_by("/srv/p.py", 1000, [1000], look) == "/srv"
    p = plan(host(uids=(0, 0, 0), cap_eff=CAP_PTRACE, package_root="/root/tw"), target(), stat_fn=look)
    warn = next(f for f in p.findings if f.check == "package-access")
    assert warn.level == "warn" and "cannot read /root" in warn.finding


@pytest.mark.parametrize(
    ("exe", "maps", "argv0", "want"),
    [
        ("/usr/bin/python3.12", [], "", "3.12"),
        ("/opt/conda/bin/python3.13t", [], "", "3.13t"),
        ("/usr/bin/myapp", ["7f00-7f01 r-xp 0 08:01 1 /usr/lib/libpython3.10.so.1.0"], "", "3.10"),
        ("/usr/bin/python", ["7f00-7f01 r-xp 0 08:01 1 /x/_json.cpython-311-x86_64-linux-gnu.so"], "", "3.11"),
        (None, [], "python3.13", "3.13"),
        ("/usr/bin/bash", ["7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6"], "bash", None),
    ],
)
def test_python_version_from_exe_maps_and_argv(exe: str | None, maps: list[str], argv0: str, want: str | None) -> None:
    found = facts.python_version(exe, maps, argv0)
    assert (str(found) if found else None) == want


def test_read_target_from_a_fake_proc(tmp_path: Path) -> None:
    d = tmp_path / "55"
    d.mkdir()
    (d / "status").write_text(
        "Name:\tpython3.12\nState:\tS (sleeping)\nTracerPid:\t77\nUid:\t5\t5\t5\t5\nGid:\t6\t6\t6\t6\n"
        "Groups:\t6 7\nNSpid:\t55\t3\n"
    )
    (d / "stat").write_text("55 (py (x) y) S " + " ".join(["0"] * 18) + " 98765 0 0\n")
    (d / "cmdline").write_bytes(b"python3.12\0-X\0disable_remote_debug\0t.py\0")
    (d / "environ").write_bytes(b"PATH=/bin\0TORCHWATCH_HOOK=1\0SECRET=x\0")
    (tmp_path / "77").mkdir()
    (tmp_path / "77/comm").write_text("gdb\n")
    t = facts.read_target(55, tmp_path)
    assert (t.state, t.tracer_pid, t.tracer_name, t.uids, t.groups, t.ns_pids) == (
        "S",
        77,
        "gdb",
        (5, 5, 5),
        (6, 7),
        (55, 3),
    )
    assert t.start_ticks == 98765
    assert t.environ == {"TORCHWATCH_HOOK": "1"}  # only the keys the checks read
    assert str(t.python) == "3.12"
    assert facts.same_instance(55, 98765, tmp_path) and not facts.same_instance(55, 1, tmp_path)
    with pytest.raises(facts.NoSuchTarget):
        facts.read_target(56, tmp_path)


class _FakeMaps(Maps):
    def __init__(self, ranges: list[tuple[int, int, str]], exe: str = "/usr/bin/python3.12") -> None:
        self.ranges, self.exe, self.pid = ranges, exe, 0
        self.code = [r for r in ranges if r[2]]  # every named mapping is code here

    def reload(self) -> None:
        pass


@pytest.mark.parametrize(
    ("line", "safe", "where"),
    [
        ("202 0x1 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f0010", False, "futex (a lock wait)"),
        ("230 0x1 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f0010", True, "clock_nanosleep"),
        ("9 0x0 0x1000 0x3 0x22 0xffffffff 0x0 0x7ffd 0x7f0010", False, "syscall 9"),  # mmap: malloc may hold a lock
        ("-1 0x7ffd 0x7f0010", False, "libc.so.6"),
        ("-1 0x7ffd 0x7f1010", True, "libtorch_cpu.so"),
        ("-1 0x7ffd 0x7f2010", False, "libpython3.12.so.1.0"),
        ("-1 0x7ffd 0x5500", False, "/usr/bin/python3.12"),
        ("-1 0x7ffd 0x9999", False, "anonymous memory"),
        ("running", False, "running"),
    ],
)
def test_safe_point_classification(line: str, safe: bool, where: str) -> None:
    assert classify(line, _MAPS, "x86_64") == (safe, where)


_MAPS = _FakeMaps(
    [
        (0x5000, 0x6000, "/usr/bin/python3.12"),
        (0x7F0000, 0x7F1000, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
        (0x7F1000, 0x7F2000, "/venv/torch/lib/libtorch_cpu.so"),
        (0x7F2000, 0x7F3000, "/usr/lib/libpython3.12.so.1.0"),
        (0x7F3000, 0x7F4000, "/usr/lib/python3.12/lib-dynload/select.cpython-312-x86_64-linux-gnu.so"),
        (0x9000, 0xA000, ""),
    ]
)


def _stack(*words: int) -> bytes:
    return b"".join(w.to_bytes(8, "little") for w in words)


@pytest.mark.parametrize(
    ("line", "stack", "safe", "where"),
    [
        # time.sleep: clock_nanosleep in libc, called by the interpreter (stale data and libc frames skipped)
        ("230 0x1 0x0 0x0 0x0 0x0 0x0 0x7ffd 0x7f0010", _stack(0x1234, 0x7F0100, 0x7F2200), True,
         "clock_nanosleep from libpython3.12.so.1.0"),
        # select.poll in a standard-library extension module
        ("7 0x1 0x0 0x0 0x0 0x0 0x0 0x7ffd 0x7f0010", _stack(0x7F3010), True,
         "poll from select.cpython-312-x86_64-linux-gnu.so"),
        # a read made by torch's own code may hold torch's locks
        ("0 0x1 0x0 0x0 0x0 0x0 0x0 0x7ffd 0x7f0010", _stack(0x7F0200, 0x7F1500, 0x7F2200), False,
         "read from libtorch_cpu.so"),
        ("230 0x1 0x0 0x0 0x0 0x0 0x0 0x7ffd 0x7f0010", _stack(0x42, 0x9010), False,
         "clock_nanosleep from unknown code"),
        # a futex wait never, whoever made it (the GIL's own hand-over waits on one)
        ("202 0x1 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f0010", _stack(0x7F2200), False, "futex (a lock wait)"),
    ],
)  # fmt: skip
def test_a_wait_is_safe_only_when_the_interpreter_made_it(line: str, stack: bytes, safe: bool, where: str) -> None:
    asked: list[int] = []

    def read(sp: int) -> bytes:
        asked.append(sp)
        return stack

    assert classify(line, _MAPS, "x86_64", read) == (safe, where)
    assert asked in ([0x7FFD], [])  # the stack is read from the stack pointer of the syscall line


def test_an_unreadable_stack_is_no_safe_point() -> None:
    def fails(sp: int) -> bytes:
        raise OSError("gone")

    line = "230 0x1 0x0 0x0 0x0 0x0 0x0 0x7ffd 0x7f0010"
    assert classify(line, _MAPS, "x86_64", fails) == (False, "clock_nanosleep, its stack unreadable")
