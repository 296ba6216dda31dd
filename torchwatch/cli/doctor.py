"""``torchwatch doctor [PID]``: what works on this machine and, with a PID, for that process.

One line per check, ``LEVEL  check: finding (fix)``:

- ``fail``: something torchwatch *needs* does not work: reading ``/proc`` through psutil
  (every reading starts there) and, with a PID, reading that process and finding Python in it;
- ``warn``: an *optional* part will be missing or degraded (ptrace for py-spy stacks and
  injection, NVML and GPM on a GPU machine, PSI, delay accounting, a CPU quota below the CPUs
  the process sees, a small ``/dev/shm``, the hook directory, each injection check);
- ``ok``: works, or is not needed here (NVML on a machine without an NVIDIA driver is a ``warn``
  that says it is expected).

Exit status 0 when nothing needed failed, else 1; ``--json`` prints the same as JSON. Every
check is read-only: nothing is created, chmodded or signalled. Each check is a function of its
inputs (:class:`Machine` gathers them from the real machine), so tests can force each one to fail.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchwatch.inject import checks, facts
from torchwatch.inject.checks import Finding
from torchwatch.inject.facts import Host, PythonVersion
from torchwatch.model.errors import TorchwatchError

SCHEMA = "torchwatch.doctor/1"
NEEDED = frozenset({"proc", "process"})
# Docker gives a container 64 MiB of /dev/shm; DataLoader workers pass every batch through it
# (PyTorch's README: "use --ipc=host or --shm-size"). Below 256 MiB a few batches in flight fill it.
SHM_WARN_BYTES = 256 << 20
PYSPY_FIRST_FOR_312 = (0, 4)  # py-spy 0.4.0 was the first to read Python 3.12 (its changelog)
_CONTAINER_MARKS = ("docker", "kubepods", "containerd", "libpod", "lxc", "crio")


def check_proc(proc: Path, read_self: Callable[[], object], own_pid: int | None = None) -> Finding:
    """psutil reads this process through ``/proc`` (needed: every reading starts there), and
    ``/proc`` is this PID namespace's (:func:`~torchwatch.watch.target.proc_namespace_error`;
    ``own_pid``: this process's PID, default :func:`os.getpid`)."""
    from torchwatch.watch.target import proc_namespace_error

    if not (proc / "self" / "stat").exists():
        return Finding("fail", "proc", f"{proc} is not mounted", "mount proc: mount -t proc proc /proc")
    other = proc_namespace_error(str(proc), own_pid)
    if other is not None:
        return Finding("fail", "proc", other.message, other.hint)
    try:
        read_self()
    except Exception as exc:
        return Finding("fail", "proc", f"psutil cannot read {proc}: {exc}", "check that /proc is readable")
    return Finding("ok", "proc", f"psutil reads {proc}")


def check_ptrace(host: Host) -> Finding:
    """ptrace, which py-spy (stacks) and injection need: capabilities and Yama."""
    scope = checks.yama(host)
    if scope.level == "fail":
        return Finding("warn", "ptrace", scope.finding + ": py-spy stacks and injection are off", scope.fix)
    who = f"uid {host.uids[0]}"
    if host.has_cap_ptrace:
        return Finding("ok", "ptrace", f"{who} with CAP_SYS_PTRACE: py-spy and injection reach any process")
    if host.uids[1] == 0:
        return Finding(
            "warn",
            "ptrace",
            "root without CAP_SYS_PTRACE (a container's default): py-spy and injection are refused",
            "start the container with --cap-add SYS_PTRACE",
        )
    return Finding(
        "ok" if host.ptrace_scope in (None, 0) else "warn",
        "ptrace",
        f"{who} without CAP_SYS_PTRACE: py-spy and injection reach this user's processes only"
        + ("" if host.ptrace_scope in (None, 0) else f" (and ptrace_scope {host.ptrace_scope} limits even those)"),
        "run torchwatch with sudo to watch other users' trainings",
    )


def container_kind(proc: Path, root: Path = Path("/")) -> str | None:
    """``docker``, ``kubepods``, ... when this runs in a container, else ``None``."""
    if (root / ".dockerenv").exists():
        return "docker"
    if (root / "run/.containerenv").exists():
        return "podman"
    for path in (proc / "1/cgroup", proc / "self/cgroup"):
        try:
            text = path.read_text()
        except OSError:
            continue
        for mark in _CONTAINER_MARKS:
            if mark in text:
                return mark
    return None


def check_container(kind: str | None, host: Host, init_pid_ns: str | None) -> Finding:
    """Container and PID namespace: informational (PIDs are the container's own)."""
    own_ns = host.namespaces.get("pid")
    if kind is None and (init_pid_ns is None or own_ns == init_pid_ns):
        return Finding("ok", "container", "not in a container; PIDs are the host's")
    where = f"in a container ({kind})" if kind else "in its own PID namespace"
    return Finding(
        "ok",
        "container",
        f"{where}: PIDs are this namespace's; NVML lists host PIDs, so a GPU may not be matched to the training",
    )


def check_target_namespaces(
    host: Host, target: facts.Target, view: facts.View, hook_base: str, refused: str
) -> list[Finding]:
    """Which PID and mount namespace ``target`` is in against torchwatch's, and what works across
    them: stacks and IDs (py-spy's thread IDs, the hook's PIDs, translated through ``NSpid``), the
    hook's files (read through ``/proc/PID/root``). Injection across them is
    :func:`~torchwatch.inject.checks.namespaces`'s (the ``inject/`` lines).

    Args:
        view: what the target sees of torchwatch's files (:func:`~torchwatch.inject.facts.read_view`).
        hook_base: the target's hook base directory, as the target names it.
        refused: why the hook would refuse that directory (``""``: fine or not made yet).
    """
    pid, ours, theirs = target.pid, host.namespaces, target.namespaces
    out: list[Finding] = []
    if ours.get("pid") == theirs.get("pid") or "pid" not in theirs:
        out.append(Finding("ok", "pid-namespace", f"PID {pid} is in torchwatch's PID namespace: IDs are the same"))
    else:
        inner = target.ns_pids[-1] if target.ns_pids else pid
        out.append(
            Finding(
                "ok",
                "pid-namespace",
                f"PID {pid} is PID {inner} in its own PID namespace ({theirs.get('pid')}; torchwatch's "
                f"{ours.get('pid')}): py-spy's thread IDs, the hook's records and its ranks' PIDs are "
                "translated through NSpid, and every ID torchwatch shows is its own (host) PID",
            )
        )
    if view.root is None:
        out.append(Finding("ok", "mount-namespace", f"PID {pid} sees the same files as torchwatch"))
    else:
        out.append(
            Finding(
                "ok",
                "mount-namespace",
                f"PID {pid} sees another filesystem ({theirs.get('mnt', 'another root')}; torchwatch's "
                f"{ours.get('mnt', '?')}): its hook files ({hook_base} in its view) are read through {view.root}",
            )
        )
    if refused:
        out.append(
            Finding(
                "warn",
                "hook-files",
                f"the hook of PID {pid} refuses {hook_base}: {refused}",
                "set TORCHWATCH_DIR for the training to a private directory of its user",
            )
        )
    return out


def _version_tuple(text: str) -> tuple[int, ...] | None:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return None if m is None else tuple(int(g) for g in m.groups() if g is not None)


def check_pyspy(binary: str | None, version: str | None, target: PythonVersion | None) -> Finding:
    """py-spy, found next to this Python or on PATH; old versions cannot read Python 3.12+."""
    if binary is None:
        return Finding("warn", "py-spy", "py-spy not found: no stack samples", "pip install -U py-spy")
    if version is None:
        return Finding("warn", "py-spy", f"{binary} does not run", "pip install --force-reinstall -U py-spy")
    parsed = _version_tuple(version)
    if target is not None and (target.major, target.minor) >= (3, 12) and parsed and parsed < PYSPY_FIRST_FOR_312:
        return Finding(
            "warn",
            "py-spy",
            f"{version.strip()} cannot read Python {target}: no stack samples",
            "pip install -U 'py-spy>=0.4'",
        )
    return Finding("ok", "py-spy", f"{version.strip()} at {binary}")


def check_nvml(status: Any, gpus: Sequence[str]) -> Finding:
    """NVML library, driver and devices, from :class:`~torchwatch.sources.nvml.NvmlSource`'s status."""
    from torchwatch.model.readings import Status

    if status.status is Status.UNAVAILABLE:
        return Finding("warn", "nvml", f"{status.reason}: no GPU readings", status.hint)
    return Finding("ok", "nvml", f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus else "NVML works")


def check_gpm(nvml_ok: bool) -> Finding:
    """GPM (SM activity on Hopper and newer) is not read by this torchwatch version."""
    if not nvml_ok:
        return Finding("ok", "gpm", "not needed: no NVIDIA GPU readable")
    return Finding(
        "warn",
        "gpm",
        "not checked by this torchwatch version: GPU busy time comes from NVML utilization only",
    )


def check_psi(proc: Path) -> Finding:
    """``/proc/pressure/{cpu,io,memory}`` (PSI, Linux 4.20+ with CONFIG_PSI)."""
    missing = [k for k in ("cpu", "io", "memory") if not os.access(proc / "pressure" / k, os.R_OK)]
    if not missing:
        return Finding("ok", "psi", "CPU, IO and memory pressure readable")
    return Finding(
        "warn",
        "psi",
        f"no pressure stall information for {', '.join(missing)}: the IO and memory pressure readings are missing",
        "use a kernel with CONFIG_PSI=y, booted without psi=0 (add psi=1 to its command line)",
    )


def check_delayacct(proc: Path) -> Finding:
    """``kernel.task_delayacct`` (Linux 5.14+): per-task block-IO and CPU-run delays."""
    try:
        value = (proc / "sys/kernel/task_delayacct").read_text().strip()
    except OSError:
        return Finding(
            "warn",
            "delayacct",
            "no kernel.task_delayacct switch (kernel before 5.14, or no CONFIG_TASK_DELAY_ACCT)",
            "boot with delayacct on the kernel command line if the kernel has it",
        )
    if value == "1":
        return Finding("ok", "delayacct", "delay accounting on (block-IO delay per thread)")
    return Finding(
        "warn",
        "delayacct",
        "delay accounting off: per-thread block-IO delay reads 0",
        "sudo sysctl kernel.task_delayacct=1",
    )


def check_cpu_quota(affinity: int, usable: float) -> Finding:
    """The usable CPUs (affinity capped by the cgroup's ``cpu.max``) vs the CPUs the process sees."""
    if usable < affinity:
        return Finding(
            "warn",
            "cpu-quota",
            f"the cgroup's CPU quota allows {usable:g} CPUs of the {affinity} this process may run on: "
            "os.cpu_count() overstates them",
            f"size num_workers by {usable:g} CPUs (torchwatch's advice already does)",
        )
    return Finding("ok", "cpu-quota", f"{usable:g} usable CPUs, no lower cgroup quota")


def check_shm(size_bytes: int | None, where: str = "/dev/shm") -> Finding:
    """``/dev/shm``: DataLoader workers hand batches over through it.

    Args:
        size_bytes: its size, bytes (``None``: missing).
        where: how it is named: ``/dev/shm``, or ``/dev/shm of PID N`` (a target in another
            mount namespace: its container's own, :func:`target_shm`).
    """
    if size_bytes is None:
        return Finding(
            "warn", "shm", f"{where} is missing: DataLoader workers cannot pass batches", "mount a tmpfs there"
        )
    mib = size_bytes / (1 << 20)
    if size_bytes < SHM_WARN_BYTES:
        return Finding(
            "warn",
            "shm",
            f"{where} is {mib:.0f} MiB: DataLoader workers' batches can fill it (bus error, or workers dying)",
            "docker run --shm-size=8g (or --ipc=host)",
        )
    return Finding("ok", "shm", f"{where} is {mib:.0f} MiB")


def target_shm(pid: int) -> tuple[str, int | None] | None:
    """``(name, size in bytes or None)`` of the ``/dev/shm`` process ``pid`` sees when it is in
    another mount namespace (a container: Docker's default is 64 MiB whatever the host's is), read
    through ``/proc/PID/root`` without following a link out of it
    (:func:`~torchwatch.wire.roots.walk_in`); ``None`` when ``pid`` sees torchwatch's files (or
    its root cannot be read: the ``/dev/shm`` torchwatch sees is then the one checked)."""
    from torchwatch import wire

    root = wire.root_of(pid)
    if root is None:
        return None
    where = f"/dev/shm of PID {pid}"
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fd = wire.walk_in(root_fd, ["dev", "shm"], f"{root}/dev/shm")
    except OSError:  # wire.Unsafe too
        return where, None
    finally:
        os.close(root_fd)
    try:
        st = os.fstatvfs(fd)
    except OSError:
        return where, None
    finally:
        os.close(fd)
    return where, st.f_frsize * st.f_blocks


def check_hook_dir(base: Path, uid: int, lstat: Callable[[Path], os.stat_result] = os.lstat) -> Finding:
    """The per-user hook directory: a directory of ``uid``, not a link, not open to others; or,
    when absent, a parent where it can be created. Read-only: nothing is created or changed."""
    try:
        st = lstat(base)
    except FileNotFoundError:
        parent = base.parent
        if os.access(parent, os.W_OK | os.X_OK):
            return Finding("ok", "hook-dir", f"{base} will be created by the first hook")
        return Finding(
            "warn", "hook-dir", f"{base} cannot be created in {parent}", "set TORCHWATCH_DIR to a writable directory"
        )
    except OSError as exc:
        return Finding("warn", "hook-dir", f"{base}: {exc.strerror or exc}", "set TORCHWATCH_DIR to another directory")
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return Finding("warn", "hook-dir", f"{base} is not a directory (a link or a file)", f"remove it: rm {base}")
    if st.st_uid != uid:
        return Finding(
            "warn",
            "hook-dir",
            f"{base} belongs to uid {st.st_uid}, not {uid}: another user may have planted it",
            f"remove it (sudo rm -r {base}) or set TORCHWATCH_DIR",
        )
    if st.st_mode & 0o077:
        return Finding(
            "warn", "hook-dir", f"{base} is open to other users (mode {st.st_mode & 0o777:o})", f"chmod 700 {base}"
        )
    return Finding("ok", "hook-dir", f"{base} is this user's (mode 700)")


def check_process(pid: int, attachable: Callable[[int], object]) -> Finding:
    """``PID`` can be watched at all (needed): exists, readable, Python or with a Python child."""
    try:
        attachable(pid)
    except TorchwatchError as exc:
        return Finding("fail", "process", exc.message, exc.hint)
    return Finding("ok", "process", f"PID {pid} can be watched (psutil reads it; Python found)")


def _pyspy_version(binary: str) -> str | None:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def _nvml() -> tuple[Any, list[str]]:
    from torchwatch.sources.nvml import NvmlSource

    source = NvmlSource(lambda: [])
    try:
        gpus = [s.name for s in source.sample(time.monotonic())]
        return source.status, gpus
    finally:
        source.close()


def _shm_bytes(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def _init_pid_ns(proc: Path) -> str | None:
    try:
        return os.readlink(proc / "1/ns/pid")
    except OSError:
        return None


@dataclass
class Machine:
    """Where the checks read from; the defaults are this machine.

    Attributes:
        proc: the ``/proc`` root.
        shm: the ``/dev/shm`` path.
        environ: the environment that decides the hook directory (``TORCHWATCH_DIR``, ``TMPDIR``).
        pyspy: the py-spy binary, ``None`` when not found; pyspy_version runs it.
        nvml: returns NVML's status and the GPU names.
        attachable: raises :class:`~torchwatch.model.errors.TorchwatchError` when a PID cannot be watched.
        read_self: reads this process through psutil (raises when it cannot).
    """

    proc: Path = facts.PROC
    shm: str = "/dev/shm"
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    pyspy: str | None = None
    pyspy_version: Callable[[str], str | None] = _pyspy_version
    nvml: Callable[[], tuple[Any, list[str]]] = _nvml
    attachable: Callable[[int], object] | None = None
    read_self: Callable[[], object] | None = None


def _psutil_self() -> object:
    import psutil

    p = psutil.Process()
    return p.cpu_times(), p.memory_info(), p.status()


def run_checks(pid: int | None, m: Machine) -> list[tuple[Finding, bool]]:
    """Every check, each with whether it is needed.

    Args:
        pid: a process to check too, or ``None``.
        m: where to read.

    Returns:
        ``[(finding, needed)]`` in print order.
    """
    from torchwatch import wire
    from torchwatch.sources.pyspy import find_pyspy
    from torchwatch.watch.target import check_attachable
    from torchwatch.wire import usable_cpus

    host = facts.read_host(m.proc)
    out: list[Finding] = [check_proc(m.proc, m.read_self or _psutil_self), check_ptrace(host)]
    out.append(check_container(container_kind(m.proc), host, _init_pid_ns(m.proc)))
    target = None
    if pid is not None:
        out.append(check_process(pid, m.attachable or check_attachable))
        try:
            target = facts.read_target(pid, m.proc)
        except facts.NoSuchTarget:
            target = None
    binary = m.pyspy if m.pyspy is not None else find_pyspy()
    version = m.pyspy_version(binary) if binary else None
    out.append(check_pyspy(binary, version, target.python if target else None))
    status, gpus = m.nvml()
    nvml = check_nvml(status, gpus)
    out += [nvml, check_gpm(nvml.level == "ok"), check_psi(m.proc), check_delayacct(m.proc)]
    try:
        affinity = len(os.sched_getaffinity(pid or 0))
    except OSError:
        affinity = os.cpu_count() or 1
    out.append(check_cpu_quota(affinity, usable_cpus(pid if pid is not None else "self")))
    theirs = target_shm(pid) if pid is not None and target is not None else None
    out.append(check_shm(theirs[1], theirs[0]) if theirs is not None else check_shm(_shm_bytes(m.shm)))
    out.append(check_hook_dir(wire.base_dir(m.environ), os.geteuid()))
    if target is not None and pid is not None:
        from torchwatch.sources.hook import HookReader

        view = facts.read_view(pid, host.package_root, target.uids[1] if target.uids else None)
        reader = HookReader(pid)
        out += check_target_namespaces(host, target, view, str(reader.base or "?"), reader.base_refused())
        plan = checks.evaluate(host, target, missing_injector=checks.injector_missing(), view=view)
        for f in plan.findings:
            level: checks.Level = "warn" if f.level == "fail" else f.level
            out.append(Finding(level, f"inject/{f.check}", f.finding, f.fix))
    return [(f, f.check in NEEDED) for f in out]


def doctor_command(pid: str | None, as_json: bool = False, machine: Machine | None = None) -> int:
    """``torchwatch doctor [PID] [--json]``: print the checks; 0 when every needed one passed, else 1.

    Raises:
        UsageError: PID is not a positive number.
    """
    from torchwatch.watch.target import parse_pid

    number = None if pid is None else parse_pid(pid)
    results = run_checks(number, machine or Machine())
    ok = not any(f.level == "fail" and needed for f, needed in results)
    if as_json:
        doc = {
            "schema": SCHEMA,
            "ok": ok,
            "pid": number,
            "checks": [
                {"level": f.level, "check": f.check, "finding": f.finding, "fix": f.fix, "needed": needed}
                for f, needed in results
            ],
        }
        print(json.dumps(doc, indent=2))
    else:
        for f, _needed in results:
            print(f.line())
        failed = sum(1 for f, n in results if f.level == "fail" and n)
        warned = sum(1 for f, _ in results if f.level == "warn")
        print(
            f"doctor: {'ok' if ok else 'FAILED'}: {failed} needed check(s) failed, {warned} warning(s)", file=sys.stderr
        )
    return 0 if ok else 1
